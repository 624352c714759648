"""A correct solution built on Hugging Face transformers: its own GPT2LMHeadModel holds the
graded weights and its own DynamicCache is the KV cache. A prompt goes through the model once
with `use_cache=True` and a fresh DynamicCache; every later token goes through with that cache
passed back, the model attending over the K/V it holds. single-step-attention runs one token at
a time through transformers' layer attention module (GPT2Attention), a DynamicCache as its
cache. Wired by tests/solutions/transformers_adapters.py (the course's tests/adapters.py
replaced); here `w` is the model itself. float32 on the CPU, no autograd. Written for
transformers 5 (the model's cache argument is `cache`; 4.x called it `past_key_values`, found
below by asking the model). Never shipped to students."""

import inspect
import os
from functools import lru_cache

import torch
from safetensors.torch import load_file
from src.gpt2 import HEAD_DIM, load_weights
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

try:  # built empty: every weight is then loaded (a random init would cost 2 s a process)
    from transformers.initialization import no_init_weights  # transformers 5
except ImportError:
    from transformers.modeling_utils import no_init_weights  # 4.x

# one thread, as NumPy's BLAS gets: idle OpenMP threads spin on a busy machine, and CPU time is
# what the grader measures
torch.set_num_threads(1)

# what GPT2LMHeadModel.forward calls its cache argument in the installed transformers
CACHE_ARG = next(
    name for name in ("cache", "past_key_values")
    if name in inspect.signature(GPT2LMHeadModel.forward).parameters
)


@lru_cache(maxsize=1)
def load_model(path: str | None = None) -> GPT2LMHeadModel:
    """transformers' GPT-2 holding the checkpoint at `path` (by default $THEINFERENCE_WEIGHTS)."""
    state = load_file(path or os.environ["THEINFERENCE_WEIGHTS"])  # wte.weight, h.0.ln_1.weight..
    vocab, n_embd = state["wte.weight"].shape
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=state["wpe.weight"].shape[0],
        n_embd=n_embd,
        n_layer=sum(1 for name in state if name.endswith(".ln_1.weight")),
        n_head=n_embd // HEAD_DIM,
        activation_function="gelu_new",  # the tanh GELU
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    )
    with no_init_weights():
        model = GPT2LMHeadModel(config)
    # transformers' GPT-2 uses Conv1D, weights [in, out] like the checkpoint: no transpose
    missing, unexpected = model.transformer.load_state_dict(state, strict=False)
    buffers = (".attn.bias", ".attn.masked_bias")  # masks older versions keep, not weights
    if unexpected or any(not name.endswith(buffers) for name in missing):
        raise ValueError(f"the checkpoint does not fit GPT-2: {missing=} {unexpected=}")
    model.lm_head.weight = model.transformer.wte.weight  # tied: logits are h @ wte.T
    return model.eval()


def context_size() -> int:
    # from the checkpoint's header (load_weights memory-maps it): no model built
    return load_weights()["wpe.weight"].shape[0]


def layer_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    # one layer's K and V, [1, heads, length, head_dim] each
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def cache_contents(cache: DynamicCache, layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # every layer's (k, v), [heads, length, head_dim] each
    return [tuple(t[0] for t in layer_kv(cache, layer)) for layer in range(layers)]


# --- stage single-step-attention -------------------------------------------------------------


@torch.no_grad()
def attn_step(ln_hidden, w, layer, cache):
    """[d] ln_1 output of ONE new token -> [d] attention contribution (no residual), through
    layer `layer`'s GPT2Attention: it projects the token, appends its K/V to `cache` (a
    DynamicCache) and attends over every row the cache holds."""
    x = torch.as_tensor(ln_hidden, dtype=torch.float32).reshape(1, 1, -1)  # [batch, 1, d]
    out, _ = w.transformer.h[layer].attn(x, cache)  # the cache, positionally: every version
    return out[0, 0]


@torch.no_grad()
def layer_attn_incremental(X, w, layer):
    """[n, d] layer inputs -> [n, d] attention-sublayer outputs (X[t] + a), one token at a time
    through a fresh DynamicCache."""
    X = torch.as_tensor(X, dtype=torch.float32)
    ln_1, cache = w.transformer.h[layer].ln_1, DynamicCache()
    return torch.stack([x + attn_step(ln_1(x), w, layer, cache) for x in X])


@torch.no_grad()
def embed(ids: list[int], w) -> torch.Tensor:
    # [n] -> [n, d]: wte[id] + wpe[position], positions 0..n-1
    return w.transformer.wte(torch.tensor(ids)) + w.transformer.wpe(torch.arange(len(ids)))


# --- the cached forward: the prompt, then each new token ----------------------------------------


@torch.no_grad()
def extend(ids: list[int], w, past_key_values: DynamicCache) -> torch.Tensor:
    """`ids` at the positions after those past_key_values holds (0.. for a fresh cache), causal
    over the cache and themselves; their K/V appended to it. -> [vocab] logits of the last."""
    out = w(torch.tensor([ids]), use_cache=True, logits_to_keep=1, **{CACHE_ARG: past_key_values})
    return out.logits[0, -1]


@torch.no_grad()
def generate(prompt_ids, max_new_tokens, w=None):
    """Greedy generation through the cache: exactly max_new_tokens new ids. Refuses a request
    past the context before any work, the model not even built."""
    if len(prompt_ids) + max_new_tokens > context_size():
        raise ValueError("prompt plus new tokens exceed the context")
    w = load_model() if w is None else w
    past_key_values = DynamicCache()
    logits = extend(list(prompt_ids), w, past_key_values)
    out = []
    for step in range(max_new_tokens):
        out.append(int(torch.argmax(logits)))
        if step + 1 < max_new_tokens:
            logits = extend(out[-1:], w, past_key_values)
    return out


# --- stage prefix-caching --------------------------------------------------------------------


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def copy_prefix(cache: DynamicCache, rows: int, layers: int) -> DynamicCache:
    # a new DynamicCache holding copies of the first `rows` positions of every layer
    out = DynamicCache()
    for layer in range(layers):
        k, v = layer_kv(cache, layer)
        out.update(k[:, :, :rows].clone(), v[:, :, :rows].clone(), layer)
    return out


class PrefixCache:
    def __init__(self, w):
        self.w = w
        self.entries = []  # (prompt ids, DynamicCache holding all of its positions)

    def process(self, prompt_ids):
        best, source = 0, None
        for ids, cached in self.entries:
            n = common_prefix(ids, prompt_ids)
            if n > best:
                best, source = n, cached
        reused = min(best, len(prompt_ids) - 1)
        if reused == 0:
            past_key_values = DynamicCache()
        else:
            past_key_values = copy_prefix(source, reused, self.w.config.n_layer)
        logits = extend(list(prompt_ids[reused:]), self.w, past_key_values)
        self.entries.append((list(prompt_ids), past_key_values))
        return logits, reused
