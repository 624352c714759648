"""A correct solution whose cache lives in PyTorch tensors: each layer's K and V are one
[1, n_head, length, head_dim] tensor grown with torch.cat, and all the arithmetic is PyTorch's.
Written on its own from the course contract, so the grader's cache-use proofs are tried on a
cache they can only reach through a tensor. Never shipped to students."""

import math
import warnings

import numpy as np
import torch

HEAD_DIM = 64

torch.set_grad_enabled(False)


def _t(w, name):
    # the weights stay NumPy (memory-mapped); a tensor view of each, made once
    cache = w.setdefault("__torch__", {}) if isinstance(w, dict) else {}
    if name not in cache:
        with warnings.catch_warnings():  # read-only weights, only ever read
            warnings.simplefilter("ignore")
            cache[name] = torch.from_numpy(np.ascontiguousarray(w[name]))
    return cache[name]


def _sizes(w):
    layers = sum(1 for name in w if name.endswith(".ln_1.weight"))
    return layers, w["wte.weight"].shape[1] // HEAD_DIM, w["wpe.weight"].shape[0]


def _ln(x, w, name):
    return torch.nn.functional.layer_norm(
        x, (x.shape[-1],), _t(w, name + ".weight"), _t(w, name + ".bias"), eps=1e-5
    )


def _linear(x, w, name):
    return x @ _t(w, name + ".weight") + _t(w, name + ".bias")


class LayerCache:
    def __init__(self, heads: int = 12):
        self.kb = torch.zeros((1, heads, 0, HEAD_DIM))
        self.vb = torch.zeros((1, heads, 0, HEAD_DIM))

    @property
    def length(self):
        return self.kb.shape[2]

    # the contract's [n_head, length, head_dim]: the batch of one dropped, a view
    @property
    def k(self):
        return self.kb[0]

    @property
    def v(self):
        return self.vb[0]


class ModelCache:
    def __init__(self, layers: int = 12, heads: int = 12):
        self.layers = [LayerCache(heads) for _ in range(layers)]


def _split(x, heads):
    # [n, d] -> [1, heads, n, head_dim]
    return x.reshape(x.shape[0], heads, HEAD_DIM).transpose(0, 1)[None]


def _attention(x, w, layer, cache, causal):
    # [n, d] layer input -> [n, d] attention contribution, the n new K/V appended first
    p = f"h.{layer}."
    heads = cache.kb.shape[1]
    q, k, v = _linear(_ln(x, w, p + "ln_1"), w, p + "attn.c_attn").split(x.shape[1], dim=-1)
    cache.kb = torch.cat([cache.kb, _split(k, heads)], dim=2)
    cache.vb = torch.cat([cache.vb, _split(v, heads)], dim=2)
    scores = _split(q, heads) @ cache.kb.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    if causal:
        n, total = x.shape[0], cache.kb.shape[2]
        visible = torch.arange(total)[None, :] <= torch.arange(total - n, total)[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ cache.vb)[0].transpose(0, 1).reshape(x.shape[0], -1)
    return _linear(out, w, p + "attn.c_proj")


def _mlp(x, w, layer):
    p = f"h.{layer}.mlp."
    h = _ln(x, w, f"h.{layer}.ln_2")
    up = torch.nn.functional.gelu(_linear(h, w, p + "c_fc"), approximate="tanh")
    return _linear(up, w, p + "c_proj")


def _run(x, w, mc, causal):
    # [n, d] embedded rows through every layer -> [vocab] logits of the last
    for layer in range(len(mc.layers)):
        x = x + _attention(x, w, layer, mc.layers[layer], causal)
        x = x + _mlp(x, w, layer)
    return _ln(x[-1], w, "ln_f") @ _t(w, "wte.weight").T


def _embed(ids, start, w):
    return _t(w, "wte.weight")[list(ids)] + _t(w, "wpe.weight")[start : start + len(ids)]


def attn_step(ln_hidden, w, layer, cache):
    p = f"h.{layer}."
    x = torch.as_tensor(np.asarray(ln_hidden, dtype=np.float32))[None]
    heads = cache.kb.shape[1]
    q, k, v = _linear(x, w, p + "attn.c_attn").split(x.shape[1], dim=-1)
    cache.kb = torch.cat([cache.kb, _split(k, heads)], dim=2)
    cache.vb = torch.cat([cache.vb, _split(v, heads)], dim=2)
    scores = _split(q, heads) @ cache.kb.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    out = (torch.softmax(scores, dim=-1) @ cache.vb)[0].transpose(0, 1).reshape(1, -1)
    return _linear(out, w, p + "attn.c_proj")[0].numpy()


def layer_attn_incremental(X, w, layer):
    heads = _sizes(w)[1]
    cache = LayerCache(heads)
    p = f"h.{layer}."
    rows = []
    for t in range(X.shape[0]):
        x = torch.as_tensor(np.asarray(X[t], dtype=np.float32))
        h = _ln(x, w, p + "ln_1").numpy()
        rows.append(X[t] + attn_step(h, w, layer, cache))
    return np.stack(rows)


def embed_token(token_id, position, w):
    return _embed([token_id], position, w)[0]


def prefill(prompt_ids, w, mc):
    return _run(_embed(prompt_ids, 0, w), w, mc, causal=True)


def block_step(x, w, layer, mc):
    x = torch.as_tensor(x)[None]
    x = x + _attention(x, w, layer, mc.layers[layer], causal=False)
    return (x + _mlp(x, w, layer))[0]


def decode_step(token_id, position, w, mc):
    return _run(_embed([token_id], position, w), w, mc, causal=False)


def decode_sequence(prompt_ids, continuation_ids, w, mc):
    prefill(prompt_ids, w, mc)
    start = len(prompt_ids)
    return torch.stack([decode_step(t, start + i, w, mc) for i, t in enumerate(continuation_ids)])


def generate(prompt_ids, max_new_tokens, w):
    layers, heads, n_ctx = _sizes(w)
    if len(prompt_ids) + max_new_tokens > n_ctx:
        raise ValueError(f"{len(prompt_ids)} + {max_new_tokens} tokens exceed {n_ctx}")
    mc = ModelCache(layers, heads)
    logits, out = prefill(prompt_ids, w, mc), []
    for step in range(max_new_tokens):
        out.append(int(torch.argmax(logits)))
        if step + 1 < max_new_tokens:
            logits = decode_step(out[-1], len(prompt_ids) + step, w, mc)
    return out


class PrefixCache:
    """Earlier prompts with their caches; a new prompt starts from a copy of the best match's
    first rows and runs only its own suffix, causally, at positions reused.."""

    def __init__(self, w):
        self.w = w
        self.entries = []  # (ids, ModelCache)

    def process(self, prompt_ids):
        layers, heads, _ = _sizes(self.w)
        best, source = 0, None
        for ids, cached in self.entries:
            n = 0
            while n < min(len(ids), len(prompt_ids)) and ids[n] == prompt_ids[n]:
                n += 1
            if n > best:
                best, source = n, cached
        reused = min(best, len(prompt_ids) - 1)
        mc = ModelCache(layers, heads)
        if reused:
            for mine, theirs in zip(mc.layers, source.layers, strict=True):
                mine.kb = theirs.kb[:, :, :reused].clone()
                mine.vb = theirs.vb[:, :, :reused].clone()
        logits = _run(_embed(prompt_ids[reused:], reused, self.w), self.w, mc, causal=True)
        self.entries.append((list(prompt_ids), mc))
        return logits, reused
