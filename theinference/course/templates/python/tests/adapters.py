"""The functions the grader calls, one per check. Wire them to your src/kvcache.py.

Each receives plain lists of token ids (copies: changing them changes nothing) and returns
lists or NumPy arrays. Raising NotImplementedError means "not started yet".
"""

from src.gpt2 import embed, load_weights, n_head, n_layer
from src.kvcache import (
    ModelCache,
    PrefixCache,
    decode_sequence,
    decode_step,
    generate,
    layer_attn_incremental,
    prefill,
)


def fresh_cache(w: dict) -> ModelCache:
    return ModelCache(n_layer(w), n_head(w))


def run_step_attention(seq_ids: list[int]):
    """single-step-attention: layer 0's attention-sublayer output at the last position, [d]."""
    w = load_weights()
    out = layer_attn_incremental(embed(seq_ids, w), w, 0)
    return out[-1]


def run_prefill(prompt_ids: list[int]):
    """build-prefill: the last prompt position's next-token logits, [vocab]."""
    w = load_weights()
    return prefill(prompt_ids, w, fresh_cache(w))


def run_prefill_cache(prompt_ids: list[int]):
    """build-prefill: what prefill leaves behind, one (k, v) per layer, each
    [n_head, len(prompt_ids), head_dim]."""
    w = load_weights()
    mc = fresh_cache(w)
    prefill(prompt_ids, w, mc)
    return [(layer.k, layer.v) for layer in mc.layers]


def run_decode_step(prompt_ids: list[int], next_id: int):
    """full-decode-step: prefill the prompt, decode next_id at position len(prompt_ids),
    return its next-token logits, [vocab]."""
    w = load_weights()
    mc = fresh_cache(w)
    prefill(prompt_ids, w, mc)
    return decode_step(next_id, len(prompt_ids), w, mc)


def run_decode_sequence(prompt_ids: list[int], continuation_ids: list[int]):
    """per-step-identity: prefill, then decode each continuation token at positions
    len(prompt_ids), len(prompt_ids) + 1, ...; one logits row per step, [steps, vocab]."""
    w = load_weights()
    return decode_sequence(prompt_ids, continuation_ids, w, fresh_cache(w))


def run_generate(prompt_ids: list[int], max_new_tokens: int):
    """generate-loop: the greedy new token ids, exactly max_new_tokens of them."""
    return generate(prompt_ids, max_new_tokens, load_weights())


def run_prefix_caching(prompts: list[list[int]]):
    """prefix-caching: the prompts in order through ONE PrefixCache; a (logits, reused) pair
    for each."""
    cache = PrefixCache(load_weights())
    return [cache.process(prompt) for prompt in prompts]
