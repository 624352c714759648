"""A correct solution that stores keys pre-scaled: each key row is multiplied by 1/sqrt(64)
once, when it enters the cache, instead of every score being scaled at every step. The stored
`k_scaled` is what attention reads; `.k` gives the keys as projected (the adapters return it).
Otherwise the reference, line for line. Never shipped to students."""

import math

import numpy as np
from src.gpt2 import (
    HEAD_DIM,
    ln_rows,
    merge_heads,
    mlp,
    n_head,
    n_layer,
    qkv,
    softmax,
    split_heads,
    unembed,
)

SCALE = np.float32(1 / math.sqrt(HEAD_DIM))  # 1/8: a power of two, so scaling is exact


class LayerCache:
    def __init__(self, heads: int = 12):
        # keys are stored already multiplied by SCALE, so a score is a plain dot product
        self.k_scaled = np.zeros((heads, 0, HEAD_DIM), dtype=np.float32)
        self.v = np.zeros((heads, 0, HEAD_DIM), dtype=np.float32)

    @property
    def length(self) -> int:
        return self.k_scaled.shape[1]

    @property
    def k(self) -> np.ndarray:
        # [heads, length, head_dim]: the keys as projected (undoing the stored scale)
        return self.k_scaled / SCALE


class ModelCache:
    def __init__(self, layers: int = 12, heads: int = 12):
        self.layers = [LayerCache(heads) for _ in range(layers)]


def append_kv(cache: LayerCache, k: np.ndarray, v: np.ndarray) -> None:
    # k, v: [heads, n_new, head_dim] appended along the sequence axis, k scaled once here
    cache.k_scaled = np.concatenate([cache.k_scaled, k * SCALE], axis=1)
    cache.v = np.concatenate([cache.v, v], axis=1)


def attend(q: np.ndarray, cache: LayerCache, w: dict, layer: int) -> np.ndarray:
    # q [heads, 1, head_dim] over the whole cache -> [d] after c_proj
    keys, values = cache.k_scaled, cache.v
    scores = q @ keys.transpose(0, 2, 1)  # [heads, 1, length], already scaled
    a = merge_heads(softmax(scores) @ values)[0]
    return a @ w[f"h.{layer}.attn.c_proj.weight"] + w[f"h.{layer}.attn.c_proj.bias"]


def attn_step(ln_hidden, w, layer, cache):
    heads = n_head(w)
    q, k, v = (split_heads(t, heads) for t in qkv(ln_hidden[None, :], w, layer))
    append_kv(cache, k, v)
    return attend(q, cache, w, layer)


def layer_attn_incremental(X, w, layer):
    p = f"h.{layer}."
    cache = LayerCache(n_head(w))
    out = []
    for t in range(X.shape[0]):
        h = ln_rows(X[t : t + 1], w[p + "ln_1.weight"], w[p + "ln_1.bias"])[0]
        out.append(X[t] + attn_step(h, w, layer, cache))
    return np.stack(out)


def embed_token(token_id, position, w):
    return w["wte.weight"][token_id] + w["wpe.weight"][position]


def prefill_layer(X, w, layer, cache):
    # [n, d] -> [n, d]: one block over the whole prompt, writing its K/V rows into cache
    p = f"h.{layer}."
    h = ln_rows(X, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
    q, k, v = (split_heads(t, n_head(w)) for t in qkv(h, w, layer))
    append_kv(cache, k, v)
    n = X.shape[0]
    keys = cache.k_scaled[:, -n:]  # [heads, n, head_dim]: the prompt's keys, as stored
    scores = q @ keys.transpose(0, 2, 1)  # [heads, n, n], already scaled
    scores = np.where(np.tri(n, dtype=bool), scores, -np.inf)
    a = merge_heads(softmax(scores) @ v)
    X = X + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
    return X + mlp(ln_rows(X, w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer)


def final_logits(x, w):
    # [d] -> [vocab]
    return unembed(ln_rows(x[None, :], w["ln_f.weight"], w["ln_f.bias"])[0], w)


def prefill(prompt_ids, w, mc):
    X = np.stack([embed_token(t, i, w) for i, t in enumerate(prompt_ids)])
    for layer in range(n_layer(w)):
        X = prefill_layer(X, w, layer, mc.layers[layer])
    return final_logits(X[-1], w)


def block_step(x, w, layer, mc):
    p = f"h.{layer}."
    h = ln_rows(x[None, :], w[p + "ln_1.weight"], w[p + "ln_1.bias"])[0]
    x = x + attn_step(h, w, layer, mc.layers[layer])
    return x + mlp(ln_rows(x[None, :], w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer)[0]


def decode_step(token_id, position, w, mc):
    x = embed_token(token_id, position, w)
    for layer in range(n_layer(w)):
        x = block_step(x, w, layer, mc)
    return final_logits(x, w)


def decode_sequence(prompt_ids, continuation_ids, w, mc):
    prefill(prompt_ids, w, mc)
    rows = []
    for step, token_id in enumerate(continuation_ids):
        rows.append(decode_step(token_id, len(prompt_ids) + step, w, mc))
    return np.stack(rows)


def generate(prompt_ids, max_new_tokens, w):
    if len(prompt_ids) + max_new_tokens > w["wpe.weight"].shape[0]:
        raise ValueError("prompt plus new tokens exceed the context")
    mc = ModelCache(n_layer(w), n_head(w))
    logits = prefill(prompt_ids, w, mc)
    out = []
    for step in range(max_new_tokens):
        out.append(int(np.argmax(logits)))
        if step + 1 < max_new_tokens:
            logits = decode_step(out[-1], len(prompt_ids) + step, w, mc)
    return out


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def copy_prefix(mc, rows, heads):
    out = ModelCache(len(mc.layers), heads)
    for src, dst in zip(mc.layers, out.layers, strict=True):
        dst.k_scaled, dst.v = src.k_scaled[:, :rows].copy(), src.v[:, :rows].copy()
    return out


class PrefixCache:
    def __init__(self, w):
        self.w = w
        self.entries = []  # (prompt ids, ModelCache holding all of its positions)

    def process(self, prompt_ids):
        w = self.w
        best, source = 0, None
        for ids, cached in self.entries:
            n = common_prefix(ids, prompt_ids)
            if n > best:
                best, source = n, cached
        reused = min(best, len(prompt_ids) - 1)
        if reused == 0:
            mc = ModelCache(n_layer(w), n_head(w))
            logits = prefill(prompt_ids, w, mc)
        else:
            mc = copy_prefix(source, reused, n_head(w))
            for position in range(reused, len(prompt_ids)):
                logits = decode_step(prompt_ids[position], position, w, mc)
        self.entries.append((list(prompt_ids), mc))
        return logits, reused
