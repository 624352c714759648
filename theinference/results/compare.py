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
    """Both arrays already of the same shape and finite; differences taken in float64."""
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    diff = np.abs(a - e)
    allowed = tol.atol + tol.rtol * np.abs(e)
    ratio = diff / allowed
    rel = diff / np.maximum(np.abs(e), np.finfo(np.float32).tiny)

    def where(flat: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(flat, e.shape))

    return Comparison(
        label=label,
        shape=tuple(e.shape),
        mismatched=int((diff > allowed).sum()),
        total=int(e.size),
        max_abs=float(diff.max(initial=0.0)),
        max_abs_index=where(int(diff.argmax())) if e.size else (),
        max_rel=float(rel.max(initial=0.0)),
        max_rel_index=where(int(rel.argmax())) if e.size else (),
        worst=float(ratio.max(initial=0.0)),
        worst_index=where(int(ratio.argmax())) if e.size else (),
        tolerance=tol,
        argmax_actual=int(a.reshape(-1, e.shape[-1])[-1].argmax()) if logits else None,
        argmax_expected=int(e.reshape(-1, e.shape[-1])[-1].argmax()) if logits else None,
    )
