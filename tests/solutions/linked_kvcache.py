"""A correct solution whose cache is a linked list: each layer's K/V is a chain of nodes, one
per position, each holding that position's key and value for every head ([n_head, head_dim]
each) with `.prev` and `.next`; attention walks the chain from its head to gather the rows.
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


class Node:
    """One position of one layer: its key and value for every head, [heads, head_dim] each."""

    __slots__ = ("k", "v", "prev", "next")

    def __init__(self, k: np.ndarray, v: np.ndarray, prev: "Node | None"):
        self.k, self.v = k, v
        self.prev, self.next = prev, None


class LayerCache:
    """One layer's K/V as a doubly linked list of positions, oldest first."""

    def __init__(self, heads: int = 12):
        self.heads = heads
        self.head: Node | None = None  # position 0
        self.tail: Node | None = None  # the latest position
        self.length = 0

    def push(self, k: np.ndarray, v: np.ndarray) -> None:
        # k, v: [heads, head_dim], one position's, linked after the tail
        node = Node(k, v, self.tail)
        if self.tail is None:
            self.head = node
        else:
            self.tail.next = node
        self.tail = node
        self.length += 1

    def nodes(self, rows: int | None = None):
        # the first `rows` positions (all by default), walking from the head
        node, left = self.head, self.length if rows is None else rows
        while node is not None and left > 0:
            yield node
            node, left = node.next, left - 1

    def stacked(self) -> tuple[np.ndarray, np.ndarray]:
        # [heads, length, head_dim] each, gathered along the list
        nodes = list(self.nodes())
        if not nodes:
            empty = np.zeros((self.heads, 0, HEAD_DIM), dtype=np.float32)
            return empty, empty.copy()
        return np.stack([n.k for n in nodes], axis=1), np.stack([n.v for n in nodes], axis=1)

    @property
    def k(self) -> np.ndarray:
        return self.stacked()[0]

    @property
    def v(self) -> np.ndarray:
        return self.stacked()[1]


class ModelCache:
    def __init__(self, layers: int = 12, heads: int = 12):
        self.layers = [LayerCache(heads) for _ in range(layers)]


def append_kv(cache: LayerCache, k: np.ndarray, v: np.ndarray) -> None:
    # k, v: [heads, n_new, head_dim]: one node per new position, each with its own copy
    for t in range(k.shape[1]):
        cache.push(k[:, t].copy(), v[:, t].copy())


def attend(q: np.ndarray, cache: LayerCache, w: dict, layer: int) -> np.ndarray:
    # q [heads, 1, head_dim] over the whole cache -> [d] after c_proj
    keys, values = cache.stacked()  # [heads, length, head_dim] each, walked along the list
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
        for node in src.nodes(rows):  # new nodes: the source list is never shared
            dst.push(node.k.copy(), node.v.copy())
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
