"""The functions the grader calls, wired to transformers' GPT-2 and its DynamicCache (through
src/kvcache.py, tests/solutions/transformers_kvcache.py). Replaces the course's tests/adapters.py:
same names, same return types (PyTorch tensors, which the grader converts)."""

from src.kvcache import (
    PrefixCache,
    cache_contents,
    embed,
    extend,
    generate,
    layer_attn_incremental,
    load_model,
)
from transformers import DynamicCache


def run_step_attention(seq_ids: list[int]):
    """single-step-attention: layer 0's attention-sublayer output at the last position, [d]."""
    model = load_model()
    return layer_attn_incremental(embed(seq_ids, model), model, 0)[-1]


def run_prefill(prompt_ids: list[int]):
    """build-prefill: the last prompt position's next-token logits, [vocab]."""
    return extend(prompt_ids, load_model(), DynamicCache())


def run_prefill_cache(prompt_ids: list[int]):
    """build-prefill: what the prompt leaves in the cache, one (k, v) per layer, each
    [n_head, len(prompt_ids), head_dim]."""
    model, past_key_values = load_model(), DynamicCache()
    extend(prompt_ids, model, past_key_values)
    return cache_contents(past_key_values, model.config.n_layer)


def run_decode_step(prompt_ids: list[int], next_id: int):
    """full-decode-step: the prompt, then next_id at position len(prompt_ids) through the
    cache: its next-token logits, [vocab]."""
    model, past_key_values = load_model(), DynamicCache()
    extend(prompt_ids, model, past_key_values)
    return extend([next_id], model, past_key_values)


def run_decode_sequence(prompt_ids: list[int], continuation_ids: list[int]):
    """per-step-identity: the prompt, then each continuation token in turn through the cache;
    one logits row per step, [steps, vocab]."""
    model, past_key_values = load_model(), DynamicCache()
    extend(prompt_ids, model, past_key_values)
    return [extend([token_id], model, past_key_values) for token_id in continuation_ids]


def run_generate(prompt_ids: list[int], max_new_tokens: int):
    """generate-loop: the greedy new token ids, exactly max_new_tokens of them."""
    return generate(prompt_ids, max_new_tokens)  # checks the request before building the model


def run_prefix_caching(prompts: list[list[int]]):
    """prefix-caching: the prompts in order through ONE PrefixCache; a (logits, reused) pair
    for each."""
    cache = PrefixCache(load_model())
    return [cache.process(prompt) for prompt in prompts]
