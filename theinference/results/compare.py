"""allclose, explained: every figure a student needs to tell a bug from rounding."""

from dataclasses import dataclass

import numpy as np

# a comparison's label over a cache the grader swapped (checks/swap.py): "logits" + this
OVER_SWAPPED = " over the swapped cache"


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


@dataclass(frozen=True)
class Comparison:
    """One allclose of a student's array against the oracle's (numpy's rule:
    |actual - expected| <= atol + rtol * |expected|)."""

    label: str  # what was compared, e.g. "logits"
    shape: tuple[int, ...]
    mismatched: int
    total: int
    max_abs: float
    max_abs_index: tuple[int, ...]
    max_rel: float
    max_rel_index: tuple[int, ...]
    worst: float  # max |a - e| / (atol + rtol |e|): below 1 passes; the error in tolerances
    worst_index: tuple[int, ...]
    tolerance: Tolerance
    argmax_actual: int | None = None  # for logits: do both pick the same next token?
    argmax_expected: int | None = None
    noise: float | None = None  # the float32 drift of a correct cached path for this case

    @property
    def noise_multiple(self) -> float | None:
        """The largest difference as a multiple of the honest float32 drift; none where a
        correct path has no drift (one token: the cached path is the recompute itself)."""
        if not self.noise:
            return None
        return self.max_abs / self.noise

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    @property
    def mismatched_percent(self) -> float:
        return 100.0 * self.mismatched / max(self.total, 1)


def compare(
    label: str, actual: np.ndarray, expected: np.ndarray, tol: Tolerance, logits: bool = False
) -> Comparison:
    """Both arrays already of the same shape and finite; differences taken in float64 (in
    place where it can: a step's logits over a long decode are millions of values, and each
    new array of them costs its pages)."""
    shape = tuple(expected.shape)
    argmax_actual = argmax_expected = None
    if logits:  # the last row's next token, before the arrays below are worked in place
        argmax_actual = int(actual.reshape(-1, shape[-1])[-1].argmax())
        argmax_expected = int(expected.reshape(-1, shape[-1])[-1].argmax())
    diff = np.subtract(actual, expected, dtype=np.float64)
    np.abs(diff, out=diff)  # |a - e|
    size = np.absolute(expected, dtype=np.float64)  # |e|
    allowed = size * tol.rtol
    allowed += tol.atol  # atol + rtol |e|
    mismatched = int(np.count_nonzero(diff > allowed))
    same = allowed.shape == diff.shape  # else a [1, n] answer against [n]: new arrays
    ratio = np.divide(diff, allowed, out=allowed if same else None)
    np.maximum(size, np.finfo(np.float32).tiny, out=size)
    rel = np.divide(diff, size, out=size if same else None)

    def where(flat: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(flat, shape))

    empty = expected.size == 0
    return Comparison(
        label=label,
        shape=shape,
        mismatched=mismatched,
        total=int(expected.size),
        max_abs=float(diff.max(initial=0.0)),
        max_abs_index=() if empty else where(int(diff.argmax())),
        max_rel=float(rel.max(initial=0.0)),
        max_rel_index=() if empty else where(int(rel.argmax())),
        worst=float(ratio.max(initial=0.0)),
        worst_index=() if empty else where(int(ratio.argmax())),
        tolerance=tol,
        argmax_actual=argmax_actual,
        argmax_expected=argmax_expected,
    )
