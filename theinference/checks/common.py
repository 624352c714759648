"""What every check shares: verdicts, the oracle's runs, and turning a returned value into an
array or a message that says why it cannot be one."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theinference import oracle
from theinference.compare import Comparison, Tolerance, compare
from theinference.config import ModelConfig
from theinference.results import Finding, Status
from theinference.runner import Foreign
from theinference.stages import Case


@dataclass
class Verdict(Finding):
    """A check's finding, with the student's numbers when they failed the comparison (kept
    only while the stage is diagnosed: a case's result carries the finding alone)."""

    actual: np.ndarray | None = None


class Rejected(Exception):
    """The returned value cannot be compared at all (wrong type, shape, NaN)."""


Ask = Callable[[list], object]  # the oracle's answer for some arguments (cached)


@dataclass(frozen=True)
class Check:
    """`arguments` turns a case into the adapter's arguments; `expect` is the oracle's answer
    to a question; `judge` validates the student's value and asks the oracle what it needs
    (usually the case's own arguments; generate-loop asks about the student's own tokens)."""

    adapter: str
    arguments: Callable[[Case, ModelConfig], list]
    expect: Callable[["OracleRuns", list], object]
    judge: Callable[[object, list, Ask, Tolerance, ModelConfig], Verdict]
    probe: str = ""  # asks the worker to alter the student's cache mid-call (see worker.py)
    second_path: Callable[["OracleRuns", list], np.ndarray] | None = None  # for the noise floor


class OracleRuns:
    """The oracle over one weights file, remembering the last few forwards (a stage's cases
    often share a prompt, e.g. prefill logits and prefill cache)."""

    def __init__(self, tensors: dict, config: ModelConfig):
        self.w = tensors
        self.config = config
        self._forwards: dict[tuple[int, ...], oracle.Forward] = {}

    def forward(self, ids: list[int]) -> oracle.Forward:
        key = tuple(ids)
        if key not in self._forwards:
            if len(self._forwards) >= 4:
                self._forwards.pop(next(iter(self._forwards)))
            self._forwards[key] = oracle.forward(ids, self.w, self.config.n_layer)
        return self._forwards[key]

    def last_logits(self, ids: list[int]) -> np.ndarray:
        # [vocab]: from a full forward if one is at hand, else from a last-row-only one
        full = self._forwards.get(tuple(ids))
        if full is not None:
            return oracle.logits_at(full.hidden, self.w, [len(ids) - 1])[0]
        f = oracle.forward(ids, self.w, self.config.n_layer, last_only=True)
        return oracle.logits_at(f.hidden, self.w, [0])[0]

    def layer0_attention_last(self, ids: list[int]) -> np.ndarray:
        # [d]: layer 0's attention-sublayer output (residual included) at the last position
        out, _ = oracle.attn_sublayer(oracle.embed(ids, self.w), self.w, 0)
        return out[-1]

    # --- the same answers along the cached path: their difference is the float32 noise -----

    def last_logits_cached_path(self, ids: list[int]) -> np.ndarray:
        # [vocab]: the prefix recomputed, then the last token through its cache
        if len(ids) == 1:  # no prefix: the same row inside a larger batch instead
            f = oracle.forward(ids + ids, self.w, self.config.n_layer)
            return oracle.logits_at(f.hidden, self.w, [0])[0]
        past = oracle.forward(ids[:-1], self.w, self.config.n_layer).kv
        f = oracle.extend(ids[-1:], self.w, self.config.n_layer, past)
        return oracle.logits_at(f.hidden, self.w, [0])[0]

    def layer0_attention_cached_path(self, ids: list[int]) -> np.ndarray:
        # [d]
        x = oracle.embed(ids, self.w)
        if len(ids) == 1:
            out, _ = oracle.attn_sublayer(oracle.embed(ids * 2, self.w), self.w, 0)
            return out[0]
        _, past = oracle.attn_sublayer(x[:-1], self.w, 0)
        out, _ = oracle.attn_sublayer(x[-1:], self.w, 0, past)
        return out[0]


# --- turning a returned value into an array, or saying why it cannot be --------------------


def as_float_array(value, what: str) -> np.ndarray:
    if value is None:
        raise Rejected(f"returned None, expected {what}: did a function forget to `return`?")
    if isinstance(value, Foreign):
        raise Rejected(f"returned a {value.type}, expected {what}")
    if isinstance(value, list):
        try:
            value = np.stack([as_float_array(v, what) for v in value])
        except (Rejected, ValueError):
            raise Rejected(
                f"returned a list whose items are not numbers of one shape, expected {what}"
            ) from None
    kind = value.dtype.kind
    if kind == "c":
        raise Rejected(f"returned complex numbers, expected {what} (real floats)")
    if kind in "biu":
        raise Rejected(
            f"returned {value.dtype} values, expected {what} as floats: "
            "an argmax or token ids instead of the values themselves?"
        )
    return value


def check_finite(a: np.ndarray, what: str) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        kind = "NaN" if np.isnan(a[first]) else "Inf"
        raise Rejected(
            f"{what} contain {int(bad.sum())} non-finite value(s): {kind} first at "
            f"index {list(first)}"
        )


def shape_hint(got: tuple, want: tuple, config: ModelConfig) -> str:
    d, vocab = config.n_embd, config.vocab_size
    if want == (vocab,) and got == (d,):
        return f"expected {vocab} logits, got {d}: is this the hidden state before the unembed?"
    if want[-1:] == got[-1:] and len(got) == len(want) + 1:
        return (
            f"expected shape {list(want)}, got {list(got)}: one row per position? "
            "Return only the last position's row."
        )
    if want == (d,) and got == (vocab,):
        return f"expected a [{d}] hidden vector, got {vocab} values: these look like logits"
    if int(np.prod(got)) == int(np.prod(want)):
        return f"expected shape {list(want)}, got {list(got)}: right numbers, wrong shape?"
    return f"expected shape {list(want)}, got {list(got)}"


def checked_array(value, want: tuple, config: ModelConfig, label: str) -> np.ndarray:
    """The value as a finite float array of exactly the wanted shape, else Rejected."""
    actual = as_float_array(value, f"{label} of shape {list(want)}")
    if actual.shape != want:
        raise Rejected(shape_hint(actual.shape, want, config))
    check_finite(actual, label)
    return actual


def vector_verdict(
    value,
    want: tuple,
    expected: Callable[[], np.ndarray],
    tol: Tolerance,
    config: ModelConfig,
    label: str,
    hint: str,
) -> Verdict:
    """Validate first (no oracle time for a wrong type or shape), then compare."""
    try:
        actual = checked_array(value, want, config, label)
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc))
    c = compare(label, actual, expected(), tol, logits=label == "logits")
    if c.passed:
        return Verdict(Status.PASSED, comparisons=[c])
    return Verdict(
        Status.FAILED, message=mismatch_message(c), hint=hint, comparisons=[c], actual=actual
    )


def mismatch_message(c: Comparison) -> str:
    return (
        f"{c.label}: {c.mismatched}/{c.total} values outside tolerance "
        f"({c.mismatched_percent:.1f}%), worst {c.worst:.3g}x the tolerance"
    )
