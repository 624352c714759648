"""A correct solution whose cache keeps each layer's K/V in memory of another kind, or where a
walk rarely looks: a module-level pool (only a key in the cache object), a class attribute, a
suspended generator's frame, a complex64 array (K real, V imaginary), int32 bit patterns,
bytearray and BytesIO, ctypes float arrays, lists of Python floats, a structured dtype, an
object array of rows, a partial's keywords (each row's values in a fixed order of their own),
and rows kept head-minor: layer L in the L-th of them. Each holder stores the whole of a
layer's K/V again when it grows and gives them back as arrays at every read, so the decode
reads what it holds. Otherwise the reference, line for line. Never shipped to students."""

import ctypes
import functools
import io
import itertools
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

_POOL = {}  # a module-level pool: each layer's K/V by the key its cache object keeps
_KEYS = itertools.count()


class Shelf:
    kept = {}  # a class attribute: each layer's K/V by the key its cache object keeps


def _pair(k, v):
    return k, v


def _keeper(k, v):
    while True:  # the K/V live in the suspended generator's frame
        yield k, v


# each holder: put(k, v) keeps [heads, n, head_dim] float32 K and V its own way; get() gives
# them back as such arrays


class ModulePool:
    def __init__(self):
        self.key = next(_KEYS)

    def put(self, k, v):
        _POOL[self.key] = (k.copy(), v.copy())

    def get(self):
        return _POOL[self.key]


class ClassShelf:
    def __init__(self):
        self.key = next(_KEYS)

    def put(self, k, v):
        Shelf.kept[self.key] = {"k": k.copy(), "v": v.copy()}

    def get(self):
        return Shelf.kept[self.key]["k"], Shelf.kept[self.key]["v"]


class GeneratorFrame:
    def put(self, k, v):
        self.frame = _keeper(k.copy(), v.copy())
        next(self.frame)

    def get(self):
        return next(self.frame)


class Complex:
    def put(self, k, v):
        self.kv = (k + 1j * v).astype(np.complex64)

    def get(self):
        return self.kv.real, self.kv.imag


class IntBits:
    def put(self, k, v):
        self.k, self.v = k.view(np.int32).copy(), v.view(np.int32).copy()

    def get(self):
        return self.k.view(np.float32), self.v.view(np.float32)


def _positions_major(a):
    return np.ascontiguousarray(a.transpose(1, 0, 2))  # [heads, n, hd] -> [n, heads, hd]


class Bytes:
    def put(self, k, v):
        self.heads = k.shape[0]
        self.k = bytearray(_positions_major(k).tobytes())
        self.v = io.BytesIO(_positions_major(v).tobytes())

    def get(self):
        k = np.frombuffer(self.k, dtype=np.float32)
        v = np.frombuffer(self.v.getvalue(), dtype=np.float32)
        return tuple(a.reshape(-1, self.heads, HEAD_DIM).transpose(1, 0, 2) for a in (k, v))


class Ctypes:
    def put(self, k, v):
        self.shape = k.shape
        kind = ctypes.c_float * k.size
        self.k, self.v = kind.from_buffer_copy(k.tobytes()), kind.from_buffer_copy(v.tobytes())

    def get(self):
        shape = self.shape
        return tuple(np.frombuffer(a, dtype=np.float32).reshape(shape) for a in (self.k, self.v))


class FloatLists:
    def put(self, k, v):
        self.heads = k.shape[0]
        width = k.shape[0] * HEAD_DIM  # one position's heads: a list of that many floats
        self.k = [row.tolist() for row in _positions_major(k).reshape(k.shape[1], width)]
        self.v = [row.tolist() for row in _positions_major(v).reshape(v.shape[1], width)]

    def get(self):
        return tuple(
            np.array(rows, dtype=np.float32).reshape(-1, self.heads, HEAD_DIM).transpose(1, 0, 2)
            for rows in (self.k, self.v)
        )


class Structured:
    def put(self, k, v):
        fields = [("k", "<f4", (HEAD_DIM,)), ("v", "<f4", (HEAD_DIM,))]
        self.kv = np.zeros(k.shape[:2], dtype=fields)
        self.kv["k"], self.kv["v"] = k, v

    def get(self):
        return self.kv["k"], self.kv["v"]


class ObjectRows:
    def put(self, k, v):
        self.rows = np.empty((2, *k.shape[:2]), dtype=object)  # one row array per cell
        for i, p in np.ndindex(*k.shape[:2]):
            self.rows[0, i, p], self.rows[1, i, p] = k[i, p].copy(), v[i, p].copy()

    def get(self):
        heads, n = self.rows.shape[1:]
        return tuple(
            np.array(self.rows[j].tolist(), dtype=np.float32).reshape(heads, n, HEAD_DIM)
            for j in (0, 1)
        )


_ORDER = np.random.default_rng(7).permutation(HEAD_DIM)  # a row's values, kept in this order


class Partial:
    # a partial's keywords, each row's values in a fixed order of their own
    def put(self, k, v):
        self.kv = functools.partial(_pair, k=k[..., _ORDER].copy(), v=v[..., _ORDER].copy())

    def get(self):
        return tuple(a[..., np.argsort(_ORDER)] for a in self.kv())


class HeadMinor:
    def put(self, k, v):
        self.heads = k.shape[0]
        # [n, head_dim * heads]: value d of head h at d * heads + h
        width = self.heads * HEAD_DIM
        self.k, self.v = (a.transpose(1, 2, 0).reshape(a.shape[1], width).copy() for a in (k, v))

    def get(self):
        return tuple(
            a.reshape(-1, HEAD_DIM, self.heads).transpose(2, 0, 1) for a in (self.k, self.v)
        )


HOLDERS = [ModulePool, ClassShelf, GeneratorFrame, Complex, IntBits, Bytes, Ctypes, FloatLists,
           Structured, ObjectRows, Partial, HeadMinor]


class LayerCache:
    def __init__(self, heads: int = 12, layer: int = 0):
        self.holder = HOLDERS[layer % len(HOLDERS)]()
        empty = np.zeros((heads, 0, HEAD_DIM), dtype=np.float32)
        self.holder.put(empty, empty)

    @property
    def k(self) -> np.ndarray:
        return self.holder.get()[0]

    @property
    def v(self) -> np.ndarray:
        return self.holder.get()[1]

    @property
    def length(self) -> int:
        return self.k.shape[1]


class ModelCache:
    def __init__(self, layers: int = 12, heads: int = 12):
        self.layers = [LayerCache(heads, layer) for layer in range(layers)]


def append_kv(cache: LayerCache, k: np.ndarray, v: np.ndarray) -> None:
    # k, v: [heads, n_new, head_dim] appended along the sequence axis: the holder keeps it all again
    old_k, old_v = cache.holder.get()
    cache.holder.put(np.concatenate([old_k, k], axis=1), np.concatenate([old_v, v], axis=1))


def attend(q: np.ndarray, cache: LayerCache, w: dict, layer: int) -> np.ndarray:
    # q [heads, 1, head_dim] over the whole cache -> [d] after c_proj
    keys, values = cache.holder.get()
    scores = q @ keys.transpose(0, 2, 1) / math.sqrt(HEAD_DIM)  # [heads, 1, length]
    a = merge_heads(softmax(scores) @ values)[0]
    return a @ w[f"h.{layer}.attn.c_proj.weight"] + w[f"h.{layer}.attn.c_proj.bias"]


def attn_step(ln_hidden, w, layer, cache):
    heads = n_head(w)
    q, k, v = (split_heads(t, heads) for t in qkv(ln_hidden[None, :], w, layer))
    append_kv(cache, k, v)
    return attend(q, cache, w, layer)


def layer_attn_incremental(X, w, layer):
    p = f"h.{layer}."
    cache = LayerCache(n_head(w), layer)
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
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(HEAD_DIM)
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
        k, v = src.holder.get()
        dst.holder.put(k[:, :rows].copy(), v[:, :rows].copy())
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
