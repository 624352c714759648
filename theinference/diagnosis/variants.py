"""The classic mistakes as `Variant`s of the oracle's forward, each replacing one step, keyed by
the name bugs.toml gives them: fingerprints.py runs them along the cached path to name a bug."""

import math

import numpy as np

from theinference.oracle.config import HEAD_DIM
from theinference.oracle.gpt2 import F32, LayerKV, Variant


def erf_gelu(x: np.ndarray) -> np.ndarray:
    # [n, f] -> [n, f]: the exact GELU, erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)
    x64 = x.astype(np.float64)
    z = np.abs(x64) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = np.sign(x64) * (1.0 - poly * np.exp(-z * z))
    return (0.5 * x64 * (1.0 + erf)).astype(np.float32)


def top_left(n: int, m: int) -> np.ndarray:
    # [n, m] visible: the triangle aligned top-left, so a single query sees key 0 alone
    return np.tri(n, m, dtype=bool)


def hides_itself(n: int, m: int) -> np.ndarray:
    # [n, m] visible: each new row sees the keys before it, never its own
    return np.tri(n, m, m - n - 1, dtype=bool)


def one_cache(kv: list[LayerKV]) -> list[LayerKV]:
    # [LayerCache()] * n: every layer's prompt rows end up in the one cache, layer after layer
    k = np.concatenate([c.k for c in kv], axis=1)
    v = np.concatenate([c.v for c in kv], axis=1)
    return [LayerKV(k, v)] * len(kv)


def last_layer_everywhere(kv: list[LayerKV]) -> list[LayerKV]:
    # [LayerCache()] * n with a prefill that assigns: each layer writes over the one before
    return [kv[-1]] * len(kv)


def reshape_split(x: np.ndarray) -> np.ndarray:
    # [n, d] -> [n_head, n, head_dim] by reshape alone: rows and heads scrambled
    n, d = x.shape
    return x.reshape(d // HEAD_DIM, n, HEAD_DIM)


def reshape_merge(x: np.ndarray) -> np.ndarray:
    # [n_head, n, head_dim] -> [n, d] by reshape alone
    h, n, hd = x.shape
    return x.reshape(n, h * hd)


VARIANTS: dict[str, Variant] = {
    "position-zero": Variant(step_position=lambda n, i: 0),
    "position-one": Variant(step_position=lambda n, i: 1),
    "position-after-append": Variant(step_position=lambda n, i: n + i + 1),
    "position-not-advancing": Variant(step_position=lambda n, i: n),
    "position-step-counter": Variant(step_position=lambda n, i: i),
    "position-last-prompt": Variant(step_position=lambda n, i: n + i - 1),
    "attend-old-length": Variant(step_mask=hides_itself),
    "causal-mask-in-step": Variant(step_mask=top_left),
    "shared-cache": Variant(prompt_cache=one_cache, cache_slot=lambda layer: 0),
    "shared-cache-layer0": Variant(cache_slot=lambda layer: 0),
    "shared-cache-assigned": Variant(
        prompt_cache=last_layer_everywhere, cache_slot=lambda layer: 0
    ),
    "missing-attn-residual": Variant(attn_residual=False),
    "missing-ln-f": Variant(ln_f=False),
    "missing-scale": Variant(scale=lambda hd: F32(1.0)),
    "scale-by-head-dim": Variant(scale=lambda hd: F32(1.0 / hd)),
    "kv-swapped": Variant(swap_kv=True),
    "heads-split-wrongly": Variant(split_heads=reshape_split, merge_heads=reshape_merge),
    "erf-gelu": Variant(gelu=erf_gelu),
    "prefill-no-causal-mask": Variant(prompt_mask=lambda n, m: None),
    "prefill-position-zero": Variant(prompt_positions=lambda n: np.zeros(n, dtype=np.intp)),
    "prefill-position-one": Variant(prompt_positions=lambda n: np.arange(1, n + 1)),
}
