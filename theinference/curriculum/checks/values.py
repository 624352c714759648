"""Turning a returned value into an array, or a message that says why it cannot be one."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theinference.curriculum.checks.common import Rejected, Verdict
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.compare import Comparison, Tolerance, compare
from theinference.student.replies import Foreign


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
    if want[-1:] == got[-1:] and len(got) == len(want) + 1 and got[0] == 1:
        return (
            f"expected shape {list(want)}, got {list(got)}: an extra leading axis of size 1 "
            "(x[-1:] where x[-1] was meant, or a missing [0]); drop it."
        )
    if want[-1:] == got[-1:] and len(got) == len(want) + 1:
        return (
            f"expected shape {list(want)}, got {list(got)}: {got[0]} rows, one per position? "
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


@dataclass(frozen=True)
class Wanted:
    """What a vector answer must be: its name in the report, its shape, and the hint a
    mismatch gives."""

    label: str
    shape: tuple
    hint: str


def vector_verdict(
    value, wanted: Wanted, expected: Callable[[], np.ndarray], tol: Tolerance, config: ModelConfig
) -> Verdict:
    """Validate first (no oracle time for a wrong type or shape), then compare."""
    label, want, hint = wanted.label, wanted.shape, wanted.hint
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
