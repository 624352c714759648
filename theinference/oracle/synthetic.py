"""A deterministic stand-in for GPT-2 124M: same tensor names and shapes, made locally.

Every number comes from integer arithmetic (a counter-based splitmix64 stream per tensor)
followed by correctly rounded IEEE operations, so the bytes are identical on every machine
and NumPy version; `SYNTHETIC_SHA256` records them and a test checks it.

Plain N(0, 0.02) weights give a model whose attention is uniform and whose greedy generation
repeats one token. The scales below follow real GPT-2's statistics more closely (embeddings
~0.14, query/key projections that make attention peaked, with a query-key correlation that
favours attending to similar tokens, the current one included), so that the course's classic
bugs move the outputs far past the tolerances and greedy generation wanders.
"""

import zlib

import numpy as np

from theinference.oracle.config import GPT2_124M, ModelConfig

SYNTHETIC_VERSION = 1
SYNTHETIC_SHA256 = "ad77915c57ebfa3bc214114805a84659f5d18554067ca05fee2a4a4aafc73d09"

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_CHUNK = 1 << 22
QK_CORR = 0.3  # query-key correlation: self-attention ~0.2-0.9, never all of it


def _splitmix64(counters: np.ndarray) -> np.ndarray:
    # [n] uint64 -> [n] uint64; integer ops wrap modulo 2**64 identically everywhere
    z = counters * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def standard_normalish(name: str, n: int) -> np.ndarray:
    """[n] float64 with mean 0 and variance 1: the sum of four 16-bit uniforms (Irwin-Hall)."""
    stream = np.uint64(zlib.crc32(name.encode()) << 32)
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, _CHUNK):
        count = min(_CHUNK, n - start)
        with np.errstate(over="ignore"):
            bits = _splitmix64(np.arange(start, start + count, dtype=np.uint64) + stream)
        mask = np.uint64(0xFFFF)
        total = sum((bits >> np.uint64(s)) & mask for s in (0, 16, 32, 48))
        # total is an exact integer in [0, 4 * 65535]; its mean is 2 * 65535, variance 4 * var(U16)
        centred = total.astype(np.float64) - 2 * 65535.0
        out[start : start + count] = centred * (1.0 / np.sqrt(4 * (65536.0**2 - 1) / 12))
    return out


def _draw(name: str, shape: tuple[int, ...], scale: float, mean: float = 0.0) -> np.ndarray:
    z = standard_normalish(name, int(np.prod(shape))).reshape(shape)
    return (mean + scale * z).astype(np.float32)


def _qkv_weight(layer: int, d: int) -> np.ndarray:
    # [d, 3d]: W_k shares part of W_q so a query scores similar keys (itself included) higher
    wq = _draw(f"h.{layer}.attn.q", (d, d), 0.05).astype(np.float64)
    wk_noise = _draw(f"h.{layer}.attn.k", (d, d), 0.05).astype(np.float64)
    wv = _draw(f"h.{layer}.attn.v", (d, d), 0.05)
    wk = (QK_CORR * wq + np.sqrt(1 - QK_CORR**2) * wk_noise).astype(np.float32)
    return np.concatenate([wq.astype(np.float32), wk, wv], axis=1)


def _mlp_out_weight(layer: int, f: int, d: int) -> np.ndarray:
    # [f, d] as antithetic halves [Z; -Z]: every column sums to exactly zero, so the positive
    # mean of GELU adds no common vector to every token (which made one token an attractor
    # that greedy generation repeated forever)
    half = _draw(f"h.{layer}.mlp.c_proj.w", (f // 2, d), 0.03)
    return np.concatenate([half, -half], axis=0)


def synthetic_tensors(config: ModelConfig = GPT2_124M) -> dict[str, np.ndarray]:
    """name -> float32 array, in the Hugging Face GPT-2 layout (Conv1D weights are [in, out])."""
    d, f = config.n_embd, 4 * config.n_embd
    t = {
        "wte.weight": _draw("wte", (config.vocab_size, d), 0.14),
        "wpe.weight": _draw("wpe", (config.n_ctx, d), 0.08),
        "ln_f.weight": _draw("ln_f.g", (d,), 0.1, mean=1.0),
        "ln_f.bias": _draw("ln_f.b", (d,), 0.02),
    }
    for i in range(config.n_layer):
        p = f"h.{i}."
        t[p + "ln_1.weight"] = _draw(p + "ln_1.g", (d,), 0.1, mean=1.0)
        t[p + "ln_1.bias"] = _draw(p + "ln_1.b", (d,), 0.02)
        t[p + "attn.c_attn.weight"] = _qkv_weight(i, d)
        t[p + "attn.c_attn.bias"] = _draw(p + "attn.c_attn.b", (3 * d,), 0.02)
        t[p + "attn.c_proj.weight"] = _draw(p + "attn.c_proj.w", (d, d), 0.03)
        t[p + "attn.c_proj.bias"] = _draw(p + "attn.c_proj.b", (d,), 0.01)
        t[p + "ln_2.weight"] = _draw(p + "ln_2.g", (d,), 0.1, mean=1.0)
        t[p + "ln_2.bias"] = _draw(p + "ln_2.b", (d,), 0.02)
        t[p + "mlp.c_fc.weight"] = _draw(p + "mlp.c_fc.w", (d, f), 0.05)
        t[p + "mlp.c_fc.bias"] = _draw(p + "mlp.c_fc.b", (f,), 0.02)
        t[p + "mlp.c_proj.weight"] = _mlp_out_weight(i, f, d)
        t[p + "mlp.c_proj.bias"] = _draw(p + "mlp.c_proj.b", (d,), 0.01)
    return t
