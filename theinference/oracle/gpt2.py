"""The recompute GPT-2 the grader trusts: plain NumPy, float32 end to end.

Every answer the grader expects from a student comes from here, computed in the grader's own
process. The math and the names are the template's src/gpt2.py (ln_rows, qkv, attn_sublayer
with its residual, mlp without it, block, unembed): GPT-2 exactly (LayerNorm eps 1e-5, tanh
GELU, 1/sqrt(head_dim) scale, Conv1D weights [in, out]); `tests/test_oracle.py` holds it against
Hugging Face transformers. What the template has not: kernels that work in place on their own
temporaries, a last layer that can compute the last row alone, and `extend`, which places new
rows after a K/V cache of its own (the noise floor's second path, `bench`'s greedy decode).

Masks are boolean and say who is VISIBLE: `visible[i, j]` is True where query i may look at
key j, as the template's `np.where(np.tri(n, dtype=bool), scores, -np.inf)` that students read.
Queries are always the LAST n of m positions, so the right mask is `np.tri(n, m, m - n)`, and
the classic mistakes are one-line masks (a triangle aligned top-left, a row that hides itself).

A `Variant` replaces one step of this forward with a classic mistake (fingerprints.py names
bugs that way); `GPT2`, the default everywhere, is the forward itself.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theinference.oracle.config import HEAD_DIM

F32 = np.float32
LN_EPS = F32(1e-5)
GELU_C = F32(np.sqrt(2.0 / np.pi))
HIDDEN = F32(-np.inf)  # a masked score: exp() makes it a zero weight


@dataclass(frozen=True)
class LayerKV:
    k: np.ndarray  # [n_head, n_seq, head_dim]
    v: np.ndarray  # [n_head, n_seq, head_dim]


# --- leaves ----------------------------------------------------------------------------------


def gelu(x: np.ndarray) -> np.ndarray:
    # [n, f] -> [n, f]: the tanh approximation GPT-2 was trained with,
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), on one temporary updated in place
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
    # [..., m] -> [..., m] IN PLACE: x is a scratch array (fresh scores), no new temporaries
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def ln_rows(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    # [n, d] -> [n, d]: LayerNorm each row (eps 1e-5)
    centred = x - x.mean(axis=-1, keepdims=True)
    var = np.einsum("ij,ij->i", centred, centred)[:, None] / F32(x.shape[-1])  # [n, 1]
    centred /= np.sqrt(var + LN_EPS)
    centred *= g
    centred += b
    return centred


def split_heads(x: np.ndarray) -> np.ndarray:
    # [n, d] -> [n_head, n, head_dim]
    n, d = x.shape
    return x.reshape(n, d // HEAD_DIM, HEAD_DIM).transpose(1, 0, 2)


def merge_heads(x: np.ndarray) -> np.ndarray:
    # [n_head, n, head_dim] -> [n, d]
    h, n, hd = x.shape
    return x.transpose(1, 0, 2).reshape(n, h * hd)


def causal(n: int, m: int) -> np.ndarray | None:
    # -> [n, m] visible: query i, at absolute position m - n + i, sees keys 0..m - n + i.
    # None for a single query: the last position sees every key, there is nothing to hide.
    return None if n == 1 else np.tri(n, m, m - n, dtype=bool)


def inverse_sqrt(head_dim: int) -> np.float32:
    return F32(1.0 / np.sqrt(head_dim))


# --- the steps a mistake can replace ---------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """The forward's replaceable steps, each GPT-2's own by default. "prompt" steps run where
    there is no cache yet (prefill), "step" ones where new rows attend over a cache."""

    prompt_positions: Callable = lambda n: slice(0, n)  # n -> the prompt's wpe rows
    prompt_mask: Callable = causal  # (n, m) -> [n, m] visible, or None
    prompt_cache: Callable = list  # the K/V a prefill leaves: one LayerKV per layer
    step_mask: Callable = causal
    step_position: Callable = lambda prompt_len, step: prompt_len + step  # for decode loops
    cache_slot: Callable = lambda layer: layer  # whose cache a step's layer reads and grows
    scale: Callable = inverse_sqrt  # head_dim -> the score scale
    split_heads: Callable = split_heads
    merge_heads: Callable = merge_heads
    swap_kv: bool = False
    attn_residual: bool = True  # a step's x + attention, or its attention alone
    gelu: Callable = gelu
    ln_f: bool = True
    # a query that sees no key: NumPy's softmax over nothing is NaN; a loop over no keys (as a
    # JavaScript one) sums nothing, a zero vector
    unseen_zero: bool = False


GPT2 = Variant()


# --- layers ----------------------------------------------------------------------------------


def embed(ids: list[int], w: dict, start: int = 0) -> np.ndarray:
    # [n] -> [n, d]: token plus absolute position start..start+n-1
    return rows_of(w, "wte.weight", ids) + w["wpe.weight"][start : start + len(ids)]


def rows_of(w: dict, name: str, ids) -> np.ndarray:
    # w[name][ids]; from the grader's private copy, those rows alone where it can (a swap's
    # few hundred random tokens need not read the 154 MB embedding whole)
    rows = getattr(w, "rows", None)
    return rows(name, ids) if rows is not None else w[name][ids]


def qkv(h: np.ndarray, w: dict, layer: int) -> list[np.ndarray]:
    # [n, d] (already layer-normed) -> q, k, v each [n, d], all heads side by side
    p = f"h.{layer}.attn.c_attn."
    out = h @ w[p + "weight"]  # [n, 3d]
    out += w[p + "bias"]
    return np.split(out, 3, axis=-1)


def attend(
    q, k, v, visible: np.ndarray | None, scale: np.float32, unseen_zero: bool = False
) -> np.ndarray:
    # q [h, n, hd] over k, v [h, m, hd] -> [h, n, hd]; visible [n, m] (None: every key)
    scores = q @ k.transpose(0, 2, 1)  # [h, n, m]
    scores *= scale
    if visible is not None:
        np.copyto(scores, HIDDEN, where=~visible)  # broadcast over heads, in place
    weights = softmax(scores)
    if unseen_zero and visible is not None:
        weights[:, ~visible.any(axis=-1)] = F32(0.0)  # no key seen: a sum over nothing
    return weights @ v


def attn_sublayer(
    x: np.ndarray,
    w: dict,
    layer: int,
    past: LayerKV | None = None,
    last_only: bool = False,
    variant: Variant = GPT2,
) -> tuple[np.ndarray, LayerKV]:
    """[n, d] new rows after `past`'s -> ([n, d] x + masked attention, this layer's K/V for
    past and new rows). With last_only the output is the last row's alone ([1, d])."""
    p = f"h.{layer}."
    h = ln_rows(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
    q, k, v = (variant.split_heads(t) for t in qkv(h, w, layer))  # [h, n, hd] each
    if past is not None:
        k = np.concatenate([past.k, k], axis=1)  # [h, m, hd]
        v = np.concatenate([past.v, v], axis=1)
    mask = variant.prompt_mask if past is None else variant.step_mask
    # the last of n rows is the last of m positions too; a head layout split or merged by a
    # bare reshape mixes rows, so such a variant computes every row and keeps the last
    shortcut = last_only and (variant.split_heads, variant.merge_heads) == (
        split_heads,
        merge_heads,
    )
    if shortcut:
        q, x = q[:, -1:], x[-1:]
    keys, values = (v, k) if variant.swap_kv else (k, v)
    visible = mask(q.shape[1], k.shape[1])
    heads = attend(q, keys, values, visible, variant.scale(HEAD_DIM), variant.unseen_zero)
    out = variant.merge_heads(heads) @ w[p + "attn.c_proj.weight"]  # [n, d]
    out += w[p + "attn.c_proj.bias"]
    if variant.attn_residual or past is None:  # a prompt's rows keep theirs
        out += x
    if last_only and not shortcut:
        out = out[-1:]
    return out, LayerKV(k=k, v=v)


def mlp(h: np.ndarray, w: dict, layer: int, act: Callable = gelu) -> np.ndarray:
    # [n, d] (already layer-normed) -> [n, d], without the residual
    p = f"h.{layer}.mlp."
    up = h @ w[p + "c_fc.weight"]  # [n, 4d]
    up += w[p + "c_fc.bias"]
    out = act(up) @ w[p + "c_proj.weight"]  # [n, d]
    out += w[p + "c_proj.bias"]
    return out


def block(
    x: np.ndarray,
    w: dict,
    layer: int,
    past: LayerKV | None = None,
    last_only: bool = False,
    variant: Variant = GPT2,
) -> tuple[np.ndarray, LayerKV]:
    # [n, d] -> ([n, d], K/V): the attention sublayer, then the MLP, each with its residual
    p = f"h.{layer}."
    x, kv = attn_sublayer(x, w, layer, past, last_only, variant)
    x += mlp(ln_rows(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer, variant.gelu)
    return x, kv


def unembed(h: np.ndarray, w: dict) -> np.ndarray:
    # [n, d] -> [n, vocab]: the tied embedding (apply ln_f first)
    return h @ w["wte.weight"].T


def logits_at(hidden: np.ndarray, w: dict, rows: list[int], variant: Variant = GPT2):
    # [n, d] -> [len(rows), vocab]: ln_f and the unembed, only where a stage needs them
    h = hidden[rows]
    if variant.ln_f:
        h = ln_rows(h, w["ln_f.weight"], w["ln_f.bias"])
    return unembed(h, w)


# --- the whole stack -------------------------------------------------------------------------


@dataclass(frozen=True)
class Forward:
    hidden: np.ndarray  # [n, d], the last block's output (before ln_f) for the new rows
    kv: list[LayerKV]  # one per layer, every position so far


def forward(
    ids: list[int], w: dict, n_layer: int, last_only: bool = False, variant: Variant = GPT2
) -> Forward:
    """The prompt from scratch under the causal mask (a prefill). With last_only, the last
    layer computes its output for the last row alone (hidden is [1, d]): all a last-position
    logit needs, one layer's MLP and projections cheaper; K/V still cover every row."""
    x = w["wte.weight"][ids] + w["wpe.weight"][variant.prompt_positions(len(ids))]  # [n, d]
    kv = []
    for layer in range(n_layer):
        prune = last_only and layer == n_layer - 1
        x, layer_kv = block(x, w, layer, None, prune, variant)
        kv.append(layer_kv)
    return Forward(hidden=x, kv=variant.prompt_cache(kv))


def extend(
    ids: list[int],
    w: dict,
    n_layer: int,
    past: list[LayerKV],
    start: int | None = None,
    variant: Variant = GPT2,
) -> Forward:
    """`ids` at positions start.. (by default right after the positions `past` holds), each
    layer attending over its cache: the same numbers as `forward` over the whole sequence
    (tested), without recomputing the past."""
    x = embed(ids, w, past[0].k.shape[1] if start is None else start)
    kv = list(past)
    for layer in range(n_layer):
        slot = variant.cache_slot(layer)
        x, kv[slot] = block(x, w, layer, kv[slot], variant=variant)
    return Forward(hidden=x, kv=kv)


def recompute_logits(ids: list[int], w: dict, n_layer: int) -> np.ndarray:
    # [n] -> [n, vocab]: the whole model from scratch, every position
    return logits_at(forward(ids, w, n_layer).hidden, w, list(range(len(ids))))


def greedy(prefilled: Forward, steps: int, w: dict, n_layer: int) -> list[int]:
    """Greedy tokens after a prefill, through the oracle's own cache: the cached decode that
    `theinference bench` compares a student's with (tested against the plain recompute)."""
    f, tokens = prefilled, []
    for _ in range(steps):
        tokens.append(int(logits_at(f.hidden, w, [-1])[0].argmax()))
        if len(tokens) < steps:
            f = extend(tokens[-1:], w, n_layer, f.kv)
    return tokens
