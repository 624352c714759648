"""Known bugs, recognised by their numbers: "your answer is what a cache shared across layers
gives", not merely "not close".

Each catalogued bug is a variant of a small cached GPT-2 (the student's path, with that one
mistake). When a stage fails, the variants that apply to its check are run on the stage's
smallest failing case, and a variant whose output matches the student's answer within the
stage's tolerance names the bug. This costs nothing on a passing run: it runs only on failure.
"""

import math
from dataclasses import dataclass

import numpy as np

from theinference.compare import Tolerance, compare
from theinference.oracle import F32, gelu, layer_norm, logits_at, merge_heads, softmax


@dataclass(frozen=True)
class Variant:
    """The student's cached path, with at most one thing wrong (the defaults are right)."""

    position: str = "right"  # right | zero | one | plus_one | not_advancing | step_counter
    sees_itself: bool = True  # False: attends over the old length, before the append
    step_mask: bool = False  # a triangular mask in the single-token step
    shared_cache: str = "no"  # no | all_layers ([LayerCache()] * n) | layer0
    ln_f: bool = True
    scale: bool = True  # 1/sqrt(head_dim)
    swap_kv: bool = False
    heads: str = "right"  # right | reshape (split without the transpose)
    gelu: str = "tanh"  # tanh | erf
    prefill_mask: bool = True
    prefill_positions: str = "right"  # right | zero


@dataclass(frozen=True)
class Bug:
    id: str
    name: str
    hint: str
    checks: tuple[str, ...]  # the checks whose answers it can explain
    variant: Variant


STEP = ("step_attention",)
DECODE = ("decode_step", "decode_sequence")
PREFILL = ("prefill_logits",)
ALL_DECODING = PREFILL + DECODE

CATALOGUE = [
    Bug(
        "position-zero",
        "the new token embedded at wpe[0]",
        "The decode position is the token's absolute index, len(prompt_ids) + step, not 0.",
        DECODE,
        Variant(position="zero"),
    ),
    Bug(
        "position-one",
        "the new token embedded at wpe[1] (a counter starting at 1)",
        "The decode position is the token's absolute index, len(prompt_ids) + step, not 1.",
        DECODE,
        Variant(position="one"),
    ),
    Bug(
        "position-after-append",
        "the position taken as the cache length after the append",
        "The new token's position is the cache length BEFORE the append (len(prompt_ids) for "
        "the first decode), not after it.",
        DECODE,
        Variant(position="plus_one"),
    ),
    Bug(
        "position-not-advancing",
        "every decode step at position len(prompt_ids)",
        "The position must advance with each step: len(prompt_ids) + step.",
        ("decode_sequence",),
        Variant(position="not_advancing"),
    ),
    Bug(
        "position-step-counter",
        "the position is the step counter (0, 1, 2...)",
        "The position is absolute: len(prompt_ids) + step, not the step number.",
        ("decode_sequence",),
        Variant(position="step_counter"),
    ),
    Bug(
        "attend-old-length",
        "attending over the old length: the new token never sees itself",
        "Append the new K/V first, then attend over all cache rows (old length + 1).",
        STEP + DECODE,
        Variant(sees_itself=False),
    ),
    Bug(
        "causal-mask-in-step",
        "a causal mask dragged into the single-token step",
        "In the single-token step the new token is last and sees every cached position: "
        "drop the triangular mask there.",
        STEP + DECODE,
        Variant(step_mask=True),
    ),
    Bug(
        "shared-cache",
        "one cache shared by every layer ([LayerCache()] * n_layer)",
        "Each layer needs its own cache: build the list with a comprehension "
        "([LayerCache() for _ in range(n)]), never [LayerCache()] * n.",
        DECODE,
        Variant(shared_cache="all_layers"),
    ),
    Bug(
        "shared-cache-layer0",
        "every layer reading and growing layer 0's cache",
        "Layer l reads and grows mc.layers[l] only.",
        DECODE,
        Variant(shared_cache="layer0"),
    ),
    Bug(
        "missing-ln-f",
        "the final LayerNorm (ln_f) skipped before the unembed",
        "Apply ln_f to the last hidden state before multiplying by wte.T.",
        ALL_DECODING,
        Variant(ln_f=False),
    ),
    Bug(
        "missing-scale",
        "attention scores not scaled by 1/sqrt(head_dim)",
        "Divide q . k by sqrt(64) before the softmax.",
        STEP + ALL_DECODING,
        Variant(scale=False),
    ),
    Bug(
        "kv-swapped",
        "K and V swapped",
        "Scores come from Q . K; the weighted sum is over V.",
        STEP + ALL_DECODING,
        Variant(swap_kv=True),
    ),
    Bug(
        "heads-split-wrongly",
        "heads split with a reshape but no transpose",
        "Split [n, 768] into heads as reshape(n, 12, 64).transpose(1, 0, 2), not "
        "reshape(12, n, 64).",
        STEP + ALL_DECODING,
        Variant(heads="reshape"),
    ),
    Bug(
        "erf-gelu",
        "GELU computed with erf instead of GPT-2's tanh approximation",
        "GPT-2 uses the tanh GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).",
        ALL_DECODING,
        Variant(gelu="erf"),
    ),
    Bug(
        "prefill-no-causal-mask",
        "prefill without the causal mask",
        "In prefill, token i attends to positions <= i only: mask the upper triangle.",
        PREFILL + DECODE,
        Variant(prefill_mask=False),
    ),
    Bug(
        "prefill-position-zero",
        "every prompt token embedded at wpe[0]",
        "Prompt token i gets wpe[i].",
        PREFILL + DECODE,
        Variant(prefill_positions="zero"),
    ),
    # recognised from the cache's shape by the prefill-cache check, not simulated
    Bug(
        "prefill-cache-short",
        "prefill leaves the cache a row short",
        "Write one cache row per prompt position: exactly prompt_len rows.",
        (),
        Variant(),
    ),
    Bug(
        "prefill-cache-long",
        "prefill leaves the cache a row (or more) too long",
        "Write one cache row per prompt position: exactly prompt_len rows.",
        (),
        Variant(),
    ),
    # recognised by the cache-use probe (the decode's answer ignores a zeroed cache)
    Bug(
        "decode-recomputes",
        "a decode step that ignores the cache and recomputes everything",
        "decode_step must read the prompt's K/V from mc.layers, not recompute them.",
        (),
        Variant(),
    ),
]
SIMULATED = set(STEP + ALL_DECODING)
FINGERPRINT_STEPS = 4
BY_ID = {bug.id: bug for bug in CATALOGUE}


# --- the variant model -----------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, far below any tolerance here
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def _erf_gelu(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))).astype(np.float32)


def _split(x: np.ndarray, n_head: int, how: str) -> np.ndarray:
    # [n, d] -> [h, n, hd]
    n, d = x.shape
    if how == "reshape":
        return x.reshape(n_head, n, d // n_head)
    return x.reshape(n, n_head, d // n_head).transpose(1, 0, 2)


class Model:
    """A cached GPT-2 with one Variant's mistake, in float32 like the oracle."""

    def __init__(self, w: dict, n_layer: int, n_head: int, variant: Variant):
        self.w, self.n_layer, self.n_head, self.v = w, n_layer, n_head, variant

    def _qkv(self, x: np.ndarray, layer: int):
        p = f"h.{layer}."
        h = layer_norm(x, self.w[p + "ln_1.weight"], self.w[p + "ln_1.bias"])
        qkv = h @ self.w[p + "attn.c_attn.weight"] + self.w[p + "attn.c_attn.bias"]
        q, k, v = (_split(t, self.n_head, self.v.heads) for t in np.split(qkv, 3, axis=-1))
        return (q, v, k) if self.v.swap_kv else (q, k, v)

    def _attend(self, q, k, v, layer: int, mask: np.ndarray | None) -> np.ndarray:
        # q [h, n, hd], k/v [h, m, hd], mask [n, m] True = hidden -> [n, d] after c_proj
        scores = q @ k.transpose(0, 2, 1)
        if self.v.scale:
            scores = scores * F32(1.0 / math.sqrt(q.shape[-1]))
        if mask is not None:
            scores = np.where(mask, F32(-np.inf), scores)
        if self.v.heads == "reshape":
            a = (softmax(scores) @ v).reshape(q.shape[1], -1)
        else:
            a = merge_heads(softmax(scores) @ v)
        p = f"h.{layer}.attn.c_proj."
        return a @ self.w[p + "weight"] + self.w[p + "bias"]

    def _mlp(self, x: np.ndarray, layer: int) -> np.ndarray:
        p = f"h.{layer}."
        h = layer_norm(x, self.w[p + "ln_2.weight"], self.w[p + "ln_2.bias"])
        up = h @ self.w[p + "mlp.c_fc.weight"] + self.w[p + "mlp.c_fc.bias"]
        up = _erf_gelu(up) if self.v.gelu == "erf" else gelu(up)
        return x + up @ self.w[p + "mlp.c_proj.weight"] + self.w[p + "mlp.c_proj.bias"]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        # [d] -> [vocab]
        if self.v.ln_f:
            return logits_at(hidden[None, :], self.w, [0])[0]
        return hidden @ self.w["wte.weight"].T

    def step_attention(self, ids: list[int]) -> np.ndarray:
        """[d]: layer 0's attention-sublayer output at the last position, cached path."""
        x = self.w["wte.weight"][ids] + self.w["wpe.weight"][: len(ids)]
        q, k, v = self._qkv(x, 0)
        q, k, v = self._cached_view(q[:, -1:], k, v)
        return x[-1] + self._attend(q, k, v, 0, self._step_mask(k.shape[1]))[0]

    def _cached_view(self, q, k, v):
        if not self.v.sees_itself:
            k, v = k[:, :-1], v[:, :-1]
        return q, k, v

    def _step_mask(self, length: int) -> np.ndarray | None:
        return ~np.tri(1, length, dtype=bool) if self.v.step_mask else None

    def prefill(self, ids: list[int]) -> tuple[np.ndarray, list]:
        """([d] last hidden, the cache: one [k, v] per layer, or one shared list)."""
        n = len(ids)
        pos = np.zeros(n, dtype=int) if self.v.prefill_positions == "zero" else np.arange(n)
        x = self.w["wte.weight"][ids] + self.w["wpe.weight"][pos]
        mask = np.triu(np.ones((n, n), dtype=bool), k=1) if self.v.prefill_mask else None
        caches = []
        for layer in range(self.n_layer):
            q, k, v = self._qkv(x, layer)
            x = self._mlp(x + self._attend(q, k, v, layer, mask), layer)
            caches.append([k, v])
        if self.v.shared_cache == "all_layers":
            shared = [
                np.concatenate([c[0] for c in caches], 1),
                np.concatenate([c[1] for c in caches], 1),
            ]
            caches = [shared] * self.n_layer
        return x[-1], caches

    def decode(self, token: int, position: int, caches: list) -> np.ndarray:
        x = self.w["wte.weight"][token] + self.w["wpe.weight"][position]
        for layer in range(self.n_layer):
            cache = caches[0] if self.v.shared_cache == "layer0" else caches[layer]
            q, k, v = self._qkv(x[None, :], layer)
            cache[0] = np.concatenate([cache[0], k], 1)
            cache[1] = np.concatenate([cache[1], v], 1)
            q, keys, values = self._cached_view(q, cache[0], cache[1])
            x = self._mlp(
                x[None, :] + self._attend(q, keys, values, layer, self._step_mask(keys.shape[1])),
                layer,
            )[0]
        return x

    def position(self, prompt_len: int, step: int) -> int:
        return {
            "right": prompt_len + step,
            "zero": 0,
            "one": 1,
            "plus_one": prompt_len + step + 1,
            "not_advancing": prompt_len,
            "step_counter": step,
        }[self.v.position]


def simulate(check: str, args: list, model: Model) -> np.ndarray:
    """What a student with this variant's bug returns for a case of `check`."""
    if check == "step_attention":
        return model.step_attention(args[0])
    if check == "prefill_logits":
        return model.logits(model.prefill(args[0])[0])
    prompt = args[0]
    steps = [args[1]] if check == "decode_step" else args[1]
    _, caches = model.prefill(prompt)
    caches = [list(c) for c in caches] if model.v.shared_cache != "all_layers" else caches
    rows = [
        model.logits(model.decode(t, model.position(len(prompt), i), caches))
        for i, t in enumerate(steps)
    ]
    return rows[0] if check == "decode_step" else np.stack(rows)


def matches(
    bug: Bug,
    check: str,
    args: list,
    actual: np.ndarray,
    tol: Tolerance,
    w: dict,
    n_layer: int,
    n_head: int,
) -> bool:
    """Does this bug's variant give the student's answer, within the stage's tolerance?"""
    try:
        out = simulate(check, args, Model(w, n_layer, n_head, bug.variant))
    except (IndexError, ValueError):  # e.g. a position past the context, an empty softmax
        return False
    comparable = out.shape == actual.shape and bool(np.all(np.isfinite(out)))
    return comparable and compare("variant", actual, out, tol).passed


def identify(
    failures: list[tuple[str, list, np.ndarray]], tol: Tolerance, w: dict, n_layer: int, n_head: int
) -> Bug | None:
    """The catalogued bug that explains every failing answer given, smallest case first.

    Two bugs can agree on a small case (with a one-token prompt, "the position never
    advances" and "the position is 1" are the same numbers), so candidates are narrowed case
    by case until one is left; larger cases are only run for the candidates still standing.
    """
    candidates = [b for b in CATALOGUE if failures and failures[0][0] in b.checks]
    for check, args, actual in failures:
        if check not in SIMULATED:
            return None
        if check == "decode_sequence":  # the first steps tell the bugs apart, cheaply
            args, actual = [args[0], args[1][:FINGERPRINT_STEPS]], actual[:FINGERPRINT_STEPS]
        candidates = [
            b for b in candidates if matches(b, check, args, actual, tol, w, n_layer, n_head)
        ]
        if len(candidates) <= 1:
            break
    return candidates[0] if candidates else None


def correct_model_check(check: str, args: list, w: dict, n_layer: int, n_head: int):
    """The variant model with no bug: tests hold it equal to the oracle."""
    return simulate(check, args, Model(w, n_layer, n_head, Variant()))
