"""The recompute GPT-2 the grader trusts: plain NumPy, float32 end to end, no cache.

Every answer the grader expects from a student comes from here, computed in the grader's own
process. The math is GPT-2's exactly (LayerNorm eps 1e-5, tanh GELU, 1/sqrt(head_dim) scale,
Conv1D weights [in, out]); `tests/test_oracle.py` holds it against Hugging Face transformers.
"""

from dataclasses import dataclass

import numpy as np

from theinference.config import HEAD_DIM

F32 = np.float32
LN_EPS = F32(1e-5)
GELU_C = F32(np.sqrt(2.0 / np.pi))


@dataclass(frozen=True)
class LayerKV:
    k: np.ndarray  # [n_head, n_seq, head_dim]
    v: np.ndarray  # [n_head, n_seq, head_dim]


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    # [n, d] -> [n, d]
    centred = x - x.mean(axis=-1, keepdims=True)
    var = np.einsum("ij,ij->i", centred, centred)[:, None] / F32(x.shape[-1])  # [n, 1]
    centred /= np.sqrt(var + LN_EPS)
    centred *= g
    centred += b
    return centred


def gelu(x: np.ndarray) -> np.ndarray:
    # tanh approximation, as GPT-2 was trained with:
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), one temporary, updated in place
    t = x * x
    t *= x
    t *= F32(0.044715)
    t += x
    t *= GELU_C
    np.tanh(t, out=t)
    t += F32(1.0)
    t *= x
    t *= F32(0.5)
    return t


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_inplace(x: np.ndarray) -> np.ndarray:
    # x is a scratch array (fresh scores): normalise it without new [h, n, m] temporaries
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def split_heads(x: np.ndarray) -> np.ndarray:
    # [n, d] -> [n_head, n, head_dim]
    n, d = x.shape
    return x.reshape(n, d // HEAD_DIM, HEAD_DIM).transpose(1, 0, 2)


def merge_heads(x: np.ndarray) -> np.ndarray:
    # [n_head, n, head_dim] -> [n, d]
    h, n, hd = x.shape
    return x.transpose(1, 0, 2).reshape(n, h * hd)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    # q [h, n, hd] for the LAST n of k/v's m positions; k, v [h, m, hd] -> [h, n, hd].
    # Query i sits at absolute position m - n + i and sees keys 0..m - n + i.
    n, m = q.shape[1], k.shape[1]
    scores = q @ k.transpose(0, 2, 1)  # [h, n, m]
    scores *= F32(1.0 / np.sqrt(q.shape[-1]))
    if n > 1:  # a single query (the last position) sees every key: nothing to mask
        scores += causal_bias(n, m)  # broadcast over heads
    return softmax_inplace(scores) @ v


def causal_bias(n: int, m: int) -> np.ndarray:
    # [n, m]: 0 where query i (absolute position m - n + i) may look, -inf at later keys
    future = np.arange(m)[None, :] > (m - n + np.arange(n))[:, None]
    return np.where(future, F32(-np.inf), F32(0.0))


def attn_sublayer(
    x: np.ndarray, w: dict, layer: int, past: LayerKV | None = None, last_only: bool = False
) -> tuple[np.ndarray, LayerKV]:
    """[n, d] new rows (after `past`'s rows) -> ([n, d] residual stream after attention,
    this layer's K/V for past and new rows together). With last_only, K/V still cover every
    row but the output is the last row's alone ([1, d])."""
    p = f"h.{layer}."
    h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
    qkv = h @ w[p + "attn.c_attn.weight"]  # [n, 3d]
    qkv += w[p + "attn.c_attn.bias"]
    q, k, v = (split_heads(part) for part in np.split(qkv, 3, axis=-1))
    if past is not None:
        k = np.concatenate([past.k, k], axis=1)
        v = np.concatenate([past.v, v], axis=1)
    if last_only:
        q, x = q[:, -1:], x[-1:]
    a = merge_heads(causal_attention(q, k, v))
    out = x + (a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"])
    return out, LayerKV(k=k, v=v)


def mlp_sublayer(x: np.ndarray, w: dict, layer: int) -> np.ndarray:
    # [n, d] -> [n, d], residual included
    p = f"h.{layer}."
    h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
    pre = h @ w[p + "mlp.c_fc.weight"]  # [n, 4d]
    pre += w[p + "mlp.c_fc.bias"]
    out = gelu(pre) @ w[p + "mlp.c_proj.weight"]  # [n, d]
    out += w[p + "mlp.c_proj.bias"]
    out += x
    return out


def embed(ids: list[int], w: dict, start: int = 0) -> np.ndarray:
    # [n] -> [n, d]: token plus absolute position start..start+n-1
    return w["wte.weight"][ids] + w["wpe.weight"][start : start + len(ids)]


@dataclass(frozen=True)
class Forward:
    hidden: np.ndarray  # [n, d], the last block's output (before ln_f) for the new rows
    kv: list[LayerKV]  # one per layer, every position so far


def forward(ids: list[int], w: dict, n_layer: int, last_only: bool = False) -> Forward:
    """The whole stack over ids, recomputed from scratch under the causal mask."""
    return extend(ids, w, n_layer, past=None, last_only=last_only)


def extend(
    ids: list[int], w: dict, n_layer: int, past: list[LayerKV] | None, last_only: bool = False
) -> Forward:
    """The stack over `ids` placed after the positions `past` holds: the same numbers as
    `forward` over the whole sequence (tested), without recomputing the past. With
    last_only, the last layer computes its output for the last row alone (hidden is [1, d]):
    all a last-position logit needs, one layer's MLP and projections cheaper."""
    start = past[0].k.shape[1] if past else 0
    x = embed(ids, w, start)
    kv = []
    for layer in range(n_layer):
        prune = last_only and layer == n_layer - 1
        x, layer_kv = attn_sublayer(x, w, layer, past[layer] if past else None, prune)
        x = mlp_sublayer(x, w, layer)
        kv.append(layer_kv)
    return Forward(hidden=x, kv=kv)


def greedy(prefilled: Forward, steps: int, w: dict, n_layer: int) -> list[int]:
    """Greedy tokens after a prefill, through the oracle's own cache: the cached decode that
    `theinference bench` compares a student's with (tested against the plain recompute)."""
    f, tokens = prefilled, []
    for _ in range(steps):
        tokens.append(int(logits_at(f.hidden, w, [-1])[0].argmax()))
        if len(tokens) < steps:
            f = extend(tokens[-1:], w, n_layer, f.kv)
    return tokens


def logits_at(hidden: np.ndarray, w: dict, rows: list[int]) -> np.ndarray:
    # [n, d] -> [len(rows), vocab]: ln_f and the tied unembed, only where a stage needs them
    h = layer_norm(hidden[rows], w["ln_f.weight"], w["ln_f.bias"])
    return h @ w["wte.weight"].T
