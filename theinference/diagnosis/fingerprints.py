"""Known bugs, recognised by their numbers: "your answer is what a cache shared across layers
gives", not merely "not close".

Each catalogued bug is the oracle's own forward with one step replaced (an `oracle.Variant`),
run along the student's cached path (prefill, then one step per token). When a stage fails,
`diagnose` runs the variants on its smallest failing cases and names a bug only when the
evidence is clear (see `diagnose`). It runs only on failure: a passing run pays nothing.
"""

import math
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from types import SimpleNamespace

import numpy as np

from theinference.diagnosis.simulator import FINGERPRINT_STEPS, SIMULATED, CachedPath
from theinference.oracle.config import HEAD_DIM
from theinference.oracle.gpt2 import F32, GPT2, LayerKV, Variant
from theinference.results.compare import Tolerance, compare


@dataclass(frozen=True)
class Bug:
    id: str
    name: str
    hint: str
    checks: tuple[str, ...]  # the checks whose answers it can explain
    variant: Variant = field(repr=False)


# --- the steps a classic mistake replaces ----------------------------------------------------


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


def reshape_split(x: np.ndarray) -> np.ndarray:
    # [n, d] -> [n_head, n, head_dim] by reshape alone: rows and heads scrambled
    n, d = x.shape
    return x.reshape(d // HEAD_DIM, n, HEAD_DIM)


def reshape_merge(x: np.ndarray) -> np.ndarray:
    # [n_head, n, head_dim] -> [n, d] by reshape alone
    h, n, hd = x.shape
    return x.reshape(n, h * hd)


STEP = ("step_attention",)
DECODE = ("decode_step", "decode_sequence")
PREFILL = ("prefill_logits",)
ALL_DECODING = PREFILL + DECODE
SCALE_HINT = "Scale q . k by 1/sqrt(head_dim) = 1/8 before the softmax"


def _bug(id_: str, name: str, hint: str, checks: tuple, **steps) -> Bug:
    return Bug(id_, name, hint, checks, Variant(**steps))


CATALOGUE = [
    _bug("position-zero", "the new token embedded at wpe[0]",
         "The decode position is the token's absolute index, len(prompt_ids) + step, not 0.",
         DECODE, step_position=lambda n, i: 0),
    _bug("position-one", "the new token embedded at wpe[1] (a counter starting at 1)",
         "The decode position is the token's absolute index, len(prompt_ids) + step, not 1.",
         DECODE, step_position=lambda n, i: 1),
    _bug("position-after-append", "the position taken as the cache length after the append",
         "The new token's position is the cache length BEFORE the append (len(prompt_ids) for "
         "the first decode), not after it.", DECODE, step_position=lambda n, i: n + i + 1),
    _bug("position-not-advancing", "every decode step at position len(prompt_ids)",
         "The position must advance with each step: len(prompt_ids) + step.",
         ("decode_sequence",), step_position=lambda n, i: n),
    _bug("position-step-counter", "the position is the step counter (0, 1, 2...)",
         "The position is absolute: len(prompt_ids) + step, not the step number.",
         ("decode_sequence",), step_position=lambda n, i: i),
    _bug("attend-old-length", "attending over the old length: the new token never sees itself",
         "Append the new K/V first, then attend over all cache rows (old length + 1).",
         STEP + DECODE, step_mask=hides_itself),
    _bug("causal-mask-in-step", "a causal mask dragged into the single-token step",
         "In the single-token step the new token is last and sees every cached position: "
         "drop the triangular mask there (a mask aligned top-left lets it see position 0 only).",
         STEP + DECODE, step_mask=top_left),
    _bug("shared-cache", "one cache shared by every layer ([LayerCache()] * n_layer)",
         "Each layer needs its own cache: build the list with a comprehension "
         "([LayerCache() for _ in range(n)]), never [LayerCache()] * n.",
         DECODE, prompt_cache=one_cache, cache_slot=lambda layer: 0),
    _bug("shared-cache-layer0", "every layer reading and growing layer 0's cache",
         "Layer l reads and grows mc.layers[l] only.", DECODE, cache_slot=lambda layer: 0),
    _bug("missing-ln-f", "the final LayerNorm (ln_f) skipped before the unembed",
         "Apply ln_f to the last hidden state before multiplying by wte.T.",
         ALL_DECODING, ln_f=False),
    _bug("missing-scale", "attention scores not scaled by 1/sqrt(head_dim)",
         SCALE_HINT + ": divide by sqrt(64).", STEP + ALL_DECODING, scale=lambda hd: F32(1.0)),
    _bug("scale-by-head-dim", "attention scores scaled by 1/head_dim instead of 1/sqrt(head_dim)",
         SCALE_HINT + ": divide by sqrt(64) = 8, not by 64.", STEP + ALL_DECODING,
         scale=lambda hd: F32(1.0 / hd)),
    _bug("kv-swapped", "K and V swapped", "Scores come from Q . K; the weighted sum is over V.",
         STEP + ALL_DECODING, swap_kv=True),
    _bug("heads-split-wrongly", "heads split with a reshape but no transpose",
         "Split [n, 768] into heads as reshape(n, 12, 64).transpose(1, 0, 2), not "
         "reshape(12, n, 64).", ALL_DECODING,  # one token at a time, a reshape splits right
         split_heads=reshape_split, merge_heads=reshape_merge),
    _bug("erf-gelu", "GELU computed with erf instead of GPT-2's tanh approximation",
         "GPT-2 uses the tanh GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).",
         ALL_DECODING, gelu=erf_gelu),
    _bug("prefill-no-causal-mask", "prefill without the causal mask",
         "In prefill, token i attends to positions <= i only: mask the upper triangle.",
         PREFILL + DECODE, prompt_mask=lambda n, m: None),
    _bug("prefill-position-zero", "every prompt token embedded at wpe[0]",
         "Prompt token i gets wpe[i].", PREFILL + DECODE,
         prompt_positions=lambda n: np.zeros(n, dtype=np.intp)),
    # recognised from the cache's shape by the prefill-cache check, not simulated
    _bug("prefill-cache-short", "prefill leaves the cache a row short",
         "Write one cache row per prompt position: exactly prompt_len rows.", ()),
    _bug("prefill-cache-long", "prefill leaves the cache a row (or more) too long",
         "Write one cache row per prompt position: exactly prompt_len rows.", ()),
    # recognised by the cache-use probe (the decode's answer ignores a zeroed cache)
    _bug("decode-recomputes", "a decode step that ignores the cache and recomputes everything",
         "decode_step must read the prompt's K/V from mc.layers, not recompute them.", ()),
]  # fmt: skip
BY_ID = {bug.id: bug for bug in CATALOGUE}


def combined(bugs: tuple[Bug, ...]) -> Variant | None:
    """One variant with every bug's replaced steps, or None when two replace the same step."""
    steps: dict = {}
    for bug in bugs:
        for f in fields(Variant):
            value = getattr(bug.variant, f.name)
            if value is not getattr(GPT2, f.name):
                if f.name in steps:
                    return None
                steps[f.name] = value
    return replace(GPT2, **steps)


# --- naming a bug only when the evidence is clear --------------------------------------------

MARGIN = 0.1  # a variant explains an answer within tolerance AND at least 10x closer than GPT-2
MIN_CASES = 2  # a bug is confirmed on a second failing case wherever the stage has one
MAX_CASES = 4  # more only while several candidates are left to tell apart
BASES = 1  # two bugs at once: pairs are tried around the single that removes the most error


@dataclass
class Diagnosis:
    """What the catalogue says about a stage's failing answers.

    One bug: `bug`, candidates [bug]. Several bugs give these very numbers: `bug` None, all of
    them in `candidates`. More than one bug in the answer (`several`): `bug` is the largest
    (fixing it removes most of the error), with the bugs found alongside it in `candidates`
    after it; alone there, the rest of the error is unexplained."""

    bug: Bug | None = None
    candidates: list[Bug] = field(default_factory=list)
    several: bool = False
    cases_tried: int = 0

    @property
    def hint(self) -> str:
        bug, others = self.bug, self.candidates[1:]
        if bug is None:
            if not self.candidates:
                return ""
            names = "; ".join(b.name for b in self.candidates)
            return f"suspected bug, one of these (each gives these very numbers): {names}."
        if not self.several:
            return f"suspected bug: {bug.name}. {bug.hint}"
        if len(others) == 1:
            return (
                f"two known bugs at once: {bug.name}, and {others[0].name}. "
                f"{bug.hint} {others[0].hint}"
            )
        if others:
            names = "; ".join(b.name for b in others)
            return f"several bugs: the largest is {bug.name}, with one of: {names}. {bug.hint}"
        return (
            f"the largest of several bugs: {bug.name} (fixing it removes most of the error; "
            f"something else is wrong too). {bug.hint}"
        )


class _Case:
    """One failing case: the student's numbers, and how far each hypothesis (one bug or a
    pair) lands from them, in tolerances."""

    def __init__(self, check: str, args: list, actual: np.ndarray, path: CachedPath, tol):
        if check == "decode_sequence":
            actual = actual[:FINGERPRINT_STEPS]
        self.check, self.args, self.actual, self.path, self.tol = check, args, actual, path, tol
        self._errors: dict = {}

    @cached_property
    def oracle_error(self) -> float:
        return self._error(GPT2)

    def error(self, bugs: tuple[Bug, ...]) -> float:
        if bugs not in self._errors:
            variant = combined(bugs)
            applies = variant is not None and all(self.check in b.checks for b in bugs)
            self._errors[bugs] = self._error(variant) if applies else math.inf
        return self._errors[bugs]

    def _error(self, variant: Variant) -> float:
        out = self.path.answer(self.check, self.args, variant)
        if out is None or out.shape != self.actual.shape:
            return math.inf
        return compare("variant", self.actual, out, self.tol).worst

    def explains(self, bugs: tuple[Bug, ...]) -> bool:
        error = self.error(bugs)
        return error <= 1.0 and error <= MARGIN * self.oracle_error


def explaining(hypotheses: list[tuple], cases: list[_Case]) -> tuple[list[tuple], int]:
    """The hypotheses that explain every case tried, and how many were tried: at least
    MIN_CASES where there are, more only while several hypotheses are left."""
    tried = 0
    for case in cases:
        hypotheses = [h for h in hypotheses if case.explains(h)]
        tried += 1
        if not hypotheses or (tried >= MIN_CASES and len(hypotheses) <= 1):
            break
    return hypotheses, tried


def diagnose(failures: list[tuple[str, list, np.ndarray]], tol: Tolerance, w: dict, config):
    """-> Diagnosis of (check, args, the student's answer) failures, smallest first.

    A bug is named only when its variant explains every failing case tried (within the
    tolerance and MARGIN-times closer than the right answer, so an answer just past the
    tolerance, or a case where the bug changes nothing, accuses nobody). When no single bug
    explains it, pairs are tried around the bugs that remove the most error."""
    path = CachedPath(w, config.n_layer)
    simulated = [f for f in failures if f[0] in SIMULATED][:MAX_CASES]
    cases = [_Case(check, args, actual, path, tol) for check, args, actual in simulated]
    if not cases:
        return Diagnosis()
    singles = [(b,) for b in CATALOGUE if cases[0].check in b.checks]
    found, tried = explaining(singles, cases)
    if found:
        bug = found[0][0] if len(found) == 1 else None
        return Diagnosis(bug, [h[0] for h in found], cases_tried=tried)
    return several_bugs(singles, cases, tried)


def several_bugs(singles: list[tuple], cases: list[_Case], tried: int) -> Diagnosis:
    """No one bug explains the answers: a pair around the bug that removes the most error, else
    that bug alone as the largest of several when it removes nearly all of it everywhere."""
    confirm = cases[:MIN_CASES]
    helping, tried = list(singles), max(tried, len(confirm))
    for case in confirm:  # each removes at least half the error everywhere
        helping = [s for s in helping if case.error(s) <= case.oracle_error / 2]
    helping.sort(key=lambda s: max(c.error(s) / c.oracle_error for c in confirm))
    for base in helping[:BASES]:
        pairs = [base + s for s in singles if s != base and combined(base + s) is not None]
        found, n = explaining(pairs, cases)
        tried = max(tried, n)
        if found:
            return Diagnosis(base[0], [base[0]] + [h[1] for h in found], True, tried)
    if helping and all(c.error(helping[0]) <= MARGIN * c.oracle_error for c in confirm):
        return Diagnosis(helping[0][0], [helping[0][0]], True, tried)
    return Diagnosis(cases_tried=tried)


def identify(failures, tol: Tolerance, w: dict, n_layer: int, n_head: int) -> Bug | None:
    """The one bug `diagnose` names (None when it names none): the older call."""
    return diagnose(failures, tol, w, SimpleNamespace(n_layer=n_layer)).bug
