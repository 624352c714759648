"""A correct solution whose cache lives in JAX arrays: each layer's K and V are one
[1, n_head, n_ctx, head_dim] array of the whole context (a fixed shape, as JAX wants: nothing is
compiled again as the cache grows), written with lax.dynamic_update_slice (immutable: every
step makes a new array, held where the last was) and attended through a mask of the positions
written; all the arithmetic is JAX's, on its CPU device. Written on its own from the course
contract, so the grader's cache-use proofs are tried on a cache whose floats live in buffers of
JAX's own. Never shipped to students."""

import math

import jax
import jax.numpy as jnp
import numpy as np

HEAD_DIM = 64


def _t(w, name):
    # the weights stay NumPy (memory-mapped); a JAX copy of each, made once
    cache = w.setdefault("__jax__", {}) if isinstance(w, dict) else {}
    if name not in cache:
        cache[name] = jnp.asarray(np.asarray(w[name], dtype=np.float32))
    return cache[name]


def _sizes(w):
    layers = sum(1 for name in w if name.endswith(".ln_1.weight"))
    return layers, w["wte.weight"].shape[1] // HEAD_DIM, w["wpe.weight"].shape[0]


def _ln(x, w, name):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * _t(w, name + ".weight") + _t(w, name + ".bias")


def _linear(x, w, name):
    return x @ _t(w, name + ".weight") + _t(w, name + ".bias")


class LayerCache:
    def __init__(self, heads: int = 12, n_ctx: int = 1024):
        self.kb = jnp.zeros((1, heads, n_ctx, HEAD_DIM), jnp.float32)
        self.vb = jnp.zeros((1, heads, n_ctx, HEAD_DIM), jnp.float32)
        self.length = 0

    def append(self, k, v):
        # k, v: [1, heads, n, head_dim] written at the positions after the last
        self.kb = jax.lax.dynamic_update_slice(self.kb, k, (0, 0, self.length, 0))
        self.vb = jax.lax.dynamic_update_slice(self.vb, v, (0, 0, self.length, 0))
        self.length += k.shape[2]

    def attend(self, q, causal):
        # q: [1, heads, n, head_dim] for the last n positions -> [1, heads, n, head_dim]
        n, room = q.shape[2], self.kb.shape[2]
        scores = q @ self.kb.transpose(0, 1, 3, 2) / math.sqrt(HEAD_DIM)  # [1, heads, n, room]
        last = np.arange(self.length - n, self.length)[:, None] if causal else self.length - 1
        visible = np.arange(room)[None, :] <= last  # written, and not after the query
        return jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1) @ self.vb

    # the contract's [n_head, length, head_dim]: the batch of one dropped
    @property
    def k(self):
        return self.kb[0, :, : self.length]

    @property
    def v(self):
        return self.vb[0, :, : self.length]


class ModelCache:
    def __init__(self, layers: int = 12, heads: int = 12, n_ctx: int = 1024):
        self.layers = [LayerCache(heads, n_ctx) for _ in range(layers)]


def _split(x, heads):
    # [n, d] -> [1, heads, n, head_dim]
    return x.reshape(x.shape[0], heads, HEAD_DIM).transpose(1, 0, 2)[None]


def _attention(x, w, layer, cache, causal):
    # [n, d] layer input -> [n, d] attention contribution, the n new K/V appended first
    p = f"h.{layer}."
    heads = cache.kb.shape[1]
    q, k, v = jnp.split(_linear(_ln(x, w, p + "ln_1"), w, p + "attn.c_attn"), 3, axis=-1)
    cache.append(_split(k, heads), _split(v, heads))
    attended = cache.attend(_split(q, heads), causal)  # [1, heads, n, head_dim]
    out = attended[0].transpose(1, 0, 2).reshape(x.shape[0], -1)
    return _linear(out, w, p + "attn.c_proj")


def _mlp(x, w, layer):
    p = f"h.{layer}.mlp."
    h = _ln(x, w, f"h.{layer}.ln_2")
    up = jax.nn.gelu(_linear(h, w, p + "c_fc"), approximate=True)
    return _linear(up, w, p + "c_proj")


def _run(x, w, mc, causal):
    # [n, d] embedded rows through every layer -> [vocab] logits of the last
    for layer in range(len(mc.layers)):
        x = x + _attention(x, w, layer, mc.layers[layer], causal)
        x = x + _mlp(x, w, layer)
    return np.asarray(_ln(x[-1], w, "ln_f") @ _t(w, "wte.weight").T)


def _embed(ids, start, w):
    rows = _t(w, "wte.weight")[jnp.asarray(list(ids))]
    return rows + _t(w, "wpe.weight")[start : start + len(ids)]


def attn_step(ln_hidden, w, layer, cache):
    p = f"h.{layer}."
    x = jnp.asarray(np.asarray(ln_hidden, dtype=np.float32))[None]
    heads = cache.kb.shape[1]
    q, k, v = jnp.split(_linear(x, w, p + "attn.c_attn"), 3, axis=-1)
    cache.append(_split(k, heads), _split(v, heads))
    out = cache.attend(_split(q, heads), causal=False)[0].transpose(1, 0, 2).reshape(1, -1)
    return np.asarray(_linear(out, w, p + "attn.c_proj")[0])


def layer_attn_incremental(X, w, layer):
    _, heads, n_ctx = _sizes(w)
    cache = LayerCache(heads, n_ctx)
    p = f"h.{layer}."
    rows = []
    for t in range(X.shape[0]):
        h = _ln(jnp.asarray(np.asarray(X[t], dtype=np.float32)), w, p + "ln_1")
        rows.append(X[t] + attn_step(h, w, layer, cache))
    return np.stack(rows)


def embed_token(token_id, position, w):
    return np.asarray(_embed([token_id], position, w)[0])


def prefill(prompt_ids, w, mc):
    return _run(_embed(prompt_ids, 0, w), w, mc, causal=True)


def block_step(x, w, layer, mc):
    x = jnp.asarray(np.asarray(x, dtype=np.float32))[None]
    x = x + _attention(x, w, layer, mc.layers[layer], causal=False)
    return np.asarray((x + _mlp(x, w, layer))[0])


def decode_step(token_id, position, w, mc):
    return _run(_embed([token_id], position, w), w, mc, causal=False)


def decode_sequence(prompt_ids, continuation_ids, w, mc):
    prefill(prompt_ids, w, mc)
    start = len(prompt_ids)
    return np.stack([decode_step(t, start + i, w, mc) for i, t in enumerate(continuation_ids)])


def generate(prompt_ids, max_new_tokens, w):
    layers, heads, n_ctx = _sizes(w)
    if len(prompt_ids) + max_new_tokens > n_ctx:
        raise ValueError(f"{len(prompt_ids)} + {max_new_tokens} tokens exceed {n_ctx}")
    mc = ModelCache(layers, heads, n_ctx)
    logits, out = prefill(prompt_ids, w, mc), []
    for step in range(max_new_tokens):
        out.append(int(np.argmax(logits)))
        if step + 1 < max_new_tokens:
            logits = decode_step(out[-1], len(prompt_ids) + step, w, mc)
    return out


class PrefixCache:
    """Earlier prompts with their caches; a new prompt starts from the best match's arrays,
    its first rows (the rest masked, then written over in new arrays), and runs only its own
    suffix, causally, at positions reused."""

    def __init__(self, w):
        self.w = w
        self.entries = []  # (ids, ModelCache)

    def process(self, prompt_ids):
        layers, heads, n_ctx = _sizes(self.w)
        best, source = 0, None
        for ids, cached in self.entries:
            n = 0
            while n < min(len(ids), len(prompt_ids)) and ids[n] == prompt_ids[n]:
                n += 1
            if n > best:
                best, source = n, cached
        reused = min(best, len(prompt_ids) - 1)
        mc = ModelCache(layers, heads, n_ctx)
        if reused:  # the match's arrays themselves: immutable, its later rows masked
            for mine, theirs in zip(mc.layers, source.layers, strict=True):
                mine.kb, mine.vb, mine.length = theirs.kb, theirs.vb, reused
        logits = _run(_embed(prompt_ids[reused:], reused, self.w), self.w, mc, causal=True)
        self.entries.append((list(prompt_ids), mc))
        return logits, reused
