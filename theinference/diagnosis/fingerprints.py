"""Known bugs, recognised by their numbers: "your answer is what a cache shared across layers
gives", not merely "not close".

Each bug of the table (bugs.toml) that has a variant (variants.py) is the oracle's own forward
with one step replaced, run along the student's cached path as the failing case's check says
(its `simulate`, oracle/cached_path.py). When a stage fails, `match_catalogue` runs the
variants on its smallest failing cases and names a bug only when the evidence is clear. It
runs only on failure: a passing run pays nothing.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

import numpy as np

from theinference.curriculum.checks import CHECKS
from theinference.diagnosis.bugs import Bug, bug_table
from theinference.diagnosis.variants import VARIANTS
from theinference.oracle.cached_path import CachedPath
from theinference.oracle.config import ModelConfig
from theinference.oracle.gpt2 import GPT2, Variant
from theinference.results.compare import Tolerance, compare

FINGERPRINT_STEPS = 4  # a decode sequence's first steps tell the bugs apart, cheaply
# (key, args, compute) -> compute()'s array, perhaps kept from an earlier run: a variant's
# answer depends on the weights and the case alone, never on the student's (grading/answers.py)
Known = Callable[[str, list, Callable[[], np.ndarray]], np.ndarray]


def computed(key: str, args: list, compute: Callable[[], np.ndarray]) -> np.ndarray:
    return compute()


def catalogue() -> list[Bug]:
    """The bugs a variant simulates, in the table's order."""
    return [b for b in bug_table().values() if b.variant is not None]


def combined(bugs: tuple[Bug, ...]) -> Variant | None:
    """One variant with every bug's replaced steps, or None when two replace the same step."""
    steps: dict = {}
    for bug in bugs:
        variant = VARIANTS[bug.variant]
        for f in fields(Variant):
            value = getattr(variant, f.name)
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
class Match:
    """What the catalogue says about a stage's failing answers.

    One bug: `bug`, candidates [bug]. Several bugs give these very numbers: `bug` None, all of
    them in `candidates`. More than one bug in the answer (`several`): `bug` is the largest
    (fixing it removes most of the error), with the bugs found alongside it in `candidates`
    after it; alone there, the rest of the error is unexplained."""

    bug: Bug | None = None
    candidates: list[Bug] = field(default_factory=list)
    several: bool = False
    cases_tried: int = 0

    def words(self, language: str, config: ModelConfig) -> tuple[str, str]:
        """(the suspected bug in words, its hint), in the course's language; ("", "") when
        nothing matched."""
        bug, others = self.bug, self.candidates[1:]
        if bug is None:
            names = [b.name(language, config) for b in self.candidates]
            hints = dict.fromkeys(b.hint(language, config) for b in self.candidates)
            return ("one of " + " or ".join(names), " ".join(hints)) if names else ("", "")
        name, hint = bug.name(language, config), bug.hint(language, config)
        if not self.several:
            return name, hint
        if len(others) == 1:
            other = others[0]
            both = f"{name}, and {other.name(language, config)}"
            return name, f"two known bugs at once: {both}. {hint} {other.hint(language, config)}"
        if others:
            names = "; ".join(b.name(language, config) for b in others)
            return name, f"several bugs: the largest is {name}, with one of: {names}. {hint}"
        return name, (
            f"the largest of several bugs: {name} (fixing it removes most of the error; "
            f"something else is wrong too). {hint}"
        )


class _Case:
    """One failing case: the student's numbers, and how far each hypothesis (one bug or a
    pair) lands from them, in tolerances."""

    def __init__(self, failure: tuple, path: CachedPath, tol, known: Known = computed):
        check, args, actual = failure
        if actual.ndim == 2 and path.steps is not None:
            actual = actual[: path.steps]  # a decode's first steps: the path runs only those
        self.check, self.args, self.actual, self.path, self.tol = check, args, actual, path, tol
        self.known = known
        self._errors: dict = {}

    @cached_property
    def oracle_error(self) -> float:
        return self._error(GPT2, "gpt2")

    def error(self, bugs: tuple[Bug, ...]) -> float:
        if bugs not in self._errors:
            variant = combined(bugs)
            applies = variant is not None and all(self.check in b.checks for b in bugs)
            name = "+".join(b.id for b in bugs)
            self._errors[bugs] = self._error(variant, name) if applies else math.inf
        return self._errors[bugs]

    def _error(self, variant: Variant, name: str) -> float:
        def simulated() -> np.ndarray:
            out = self.path.answer(CHECKS[self.check].simulate, self.args, variant)
            return np.asarray(np.nan) if out is None else out  # no cached path: kept too

        key = f"variant:{name}:{self.check}:{self.path.steps}"
        out = self.known(key, self.args, simulated)
        if out.shape != self.actual.shape:
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


def match_catalogue(failures: list[tuple[str, list, np.ndarray]], tol: Tolerance, w: dict, config,
                    known: Known = computed):
    """-> Match of (check, args, the student's answer) failures, smallest first.

    A bug is named only when its variant explains every failing case tried (within the
    tolerance and MARGIN-times closer than the right answer, so an answer just past the
    tolerance, or a case where the bug changes nothing, accuses nobody). When no single bug
    explains it, pairs are tried around the bugs that remove the most error."""
    path = CachedPath(w, config.n_layer, steps=FINGERPRINT_STEPS)
    simulated = [f for f in failures if CHECKS[f[0]].simulate is not None][:MAX_CASES]
    cases = [_Case(failure, path, tol, known) for failure in simulated]
    if not cases:
        return Match()
    singles = [(b,) for b in catalogue() if cases[0].check in b.checks]
    found, tried = explaining(singles, cases)
    if found:
        bug = found[0][0] if len(found) == 1 else None
        return Match(bug, [h[0] for h in found], cases_tried=tried)
    return several_bugs(singles, cases, tried)


def several_bugs(singles: list[tuple], cases: list[_Case], tried: int) -> Match:
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
            return Match(base[0], [base[0]] + [h[1] for h in found], True, tried)
    if helping and all(c.error(helping[0]) <= MARGIN * c.oracle_error for c in confirm):
        return Match(helping[0][0], [helping[0][0]], True, tried)
    return Match(cases_tried=tried)
