"""GPT-2 without a cache: PROVIDED, complete. Your building blocks, and the recompute path.

Every function here recomputes from scratch. Your src/kvcache.py reuses the pieces (ln_rows,
qkv, mlp, unembed) and changes two things: attention reads a cache, and a decoded token is
embedded at its absolute position (embed places a sequence at 0..n-1, from its start). Masks
are boolean and say who is visible: True where a query may look at a key. Weights use the
Hugging Face names (wte, wpe, h.{layer}.attn.c_attn, ...); GPT-2's Conv1D weights are stored
[in, out], so every projection is `x @ W + b`.
"""

import json
import math
import os
import struct
from functools import lru_cache

import numpy as np

HEAD_DIM = 64  # every GPT-2 size uses 64-wide heads


@lru_cache(maxsize=2)
def load_weights(path: str | None = None) -> dict[str, np.ndarray]:
    """Map a .safetensors checkpoint read-only; the path defaults to $THEINFERENCE_WEIGHTS."""
    path = path or os.environ["THEINFERENCE_WEIGHTS"]
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    return {
        name: data[t["data_offsets"][0] : t["data_offsets"][1]].view("<f4").reshape(t["shape"])
        for name, t in header.items()
    }


def n_layer(w: dict) -> int:
    return sum(1 for name in w if name.endswith(".ln_1.weight"))


def n_head(w: dict) -> int:
    return w["wte.weight"].shape[1] // HEAD_DIM


def gelu(x: np.ndarray) -> np.ndarray:
    # tanh approximation, as GPT-2 was trained with; plain Python floats keep float32 float32
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ln_rows(X: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    # [n, d] -> [n, d]: LayerNorm each row (eps 1e-5)
    mean = X.mean(axis=-1, keepdims=True)
    var = X.var(axis=-1, keepdims=True)
    return (X - mean) / np.sqrt(var + 1e-5) * g + b


def embed(ids: list[int], w: dict) -> np.ndarray:
    # [n] -> [n, d]: token embedding plus absolute position 0..n-1
    return w["wte.weight"][ids] + w["wpe.weight"][: len(ids)]


def qkv(H: np.ndarray, w: dict, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # [n, d] (already layer-normed) -> q, k, v each [n, d], all heads concatenated
    p = f"h.{layer}.attn.c_attn."
    return np.split(H @ w[p + "weight"] + w[p + "bias"], 3, axis=-1)


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    # [n, d] -> [heads, n, head_dim]
    return x.reshape(x.shape[0], heads, -1).transpose(1, 0, 2)


def merge_heads(x: np.ndarray) -> np.ndarray:
    # [heads, n, head_dim] -> [n, d]
    return x.transpose(1, 0, 2).reshape(x.shape[1], -1)


def attn_sublayer(X: np.ndarray, w: dict, layer: int) -> np.ndarray:
    # [n, d] -> [n, d]: masked self-attention over every row, residual included
    p = f"h.{layer}."
    H = ln_rows(X, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
    q, k, v = (split_heads(t, n_head(w)) for t in qkv(H, w, layer))
    n = X.shape[0]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])  # [heads, n, n]
    visible = np.tri(n, dtype=bool)  # [n, n]: token i sees tokens 0..i
    scores = np.where(visible, scores, -np.inf)
    a = merge_heads(softmax(scores) @ v)
    return X + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]


def mlp(H: np.ndarray, w: dict, layer: int) -> np.ndarray:
    # [n, d] (already layer-normed) -> [n, d], without the residual
    p = f"h.{layer}.mlp."
    up = gelu(H @ w[p + "c_fc.weight"] + w[p + "c_fc.bias"])  # [n, 4d]
    return up @ w[p + "c_proj.weight"] + w[p + "c_proj.bias"]


def block(X: np.ndarray, w: dict, layer: int) -> np.ndarray:
    # [n, d] -> [n, d]: attention sublayer, then the MLP sublayer, each with its residual
    p = f"h.{layer}."
    X = attn_sublayer(X, w, layer)
    return X + mlp(ln_rows(X, w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer)


def unembed(h: np.ndarray, w: dict) -> np.ndarray:
    # [..., d] -> [..., vocab]: tied embedding (apply ln_f first)
    return h @ w["wte.weight"].T


def recompute_logits(ids: list[int], w: dict) -> np.ndarray:
    # [n] -> [n, vocab]: the whole model from scratch, every position
    X = embed(ids, w)
    for layer in range(n_layer(w)):
        X = block(X, w, layer)
    return unembed(ln_rows(X, w["ln_f.weight"], w["ln_f.bias"]), w)
