"""A stage's diagnosis, resolved once, while the stage is graded: which bug explains its failing
answers (or which error it raised), the hint that fits, the case to show in full, where it
first departs, the worst case. Every output reads the result; none works any of this out."""

from dataclasses import dataclass, field

import numpy as np

from theinference.diagnosis.bugs import bug_table
from theinference.diagnosis.errors import lesson_for, shares_one_error
from theinference.diagnosis.fingerprints import MIN_CASES, Known, Match, computed, match_catalogue
from theinference.diagnosis.numbers import numbers_shown
from theinference.oracle.recompute import Recompute
from theinference.results import CaseResult, Status
from theinference.results.compare import Tolerance

DIAGNOSED_STATUSES = (Status.FAILED, Status.ERROR, Status.TIMEOUT)


@dataclass(frozen=True)
class Failure:
    """A failing case whose numbers the bug catalogue can be tried on."""

    check: str
    args: list
    actual: np.ndarray


@dataclass(frozen=True)
class StageDiagnosis:
    """What a stage that did not pass teaches (StageResult carries each field)."""

    suspected_bug: str | None = None  # a bug id: the catalogue's, or one a judge recognised
    candidates: list[str] = field(default_factory=list)
    bug_name: str = ""  # the suspected bug, candidates or error lesson, in words
    hint: str = ""
    lesson: str | None = None  # the bug id an error's signature names
    where: dict | None = None  # where the case shown first departs
    first_case: str | None = None  # the case to show in full
    worst_case: str | None = None  # the case furthest past the tolerance, when another one
    shared_error: bool = False  # every case that did not pass raised the same error
    diagnosed: bool = False  # the catalogue was tried on its failing answers


@dataclass(frozen=True)
class Teaching:
    """The diagnosis's words and the case they sit under."""

    case: CaseResult
    bug_name: str = ""
    hint: str = ""
    suspected_bug: str | None = None
    candidates: tuple[str, ...] = ()


def catalogue_match(failures: list[Failure], tolerance: Tolerance, recompute: Recompute,
                    known: Known = computed) -> Match:
    """What the bug catalogue says of the failing answers, the smallest first."""
    ordered = sorted(failures, key=lambda f: len(str(f.args)))
    return match_catalogue([(f.check, f.args, f.actual) for f in ordered], tolerance,
                           recompute.w, recompute.config, known)


def named_alone(found: Match) -> bool:
    """One bug explains every failing answer tried, on as many as confirm it: more answers
    would name no other (what a failing try asks again for stops here)."""
    return (found.bug is not None and not found.several and len(found.candidates) == 1
            and found.cases_tried >= MIN_CASES)


def diagnose_stage(
    cases: list[CaseResult],
    failures: list[Failure],
    tolerance: Tolerance,
    recompute: Recompute,
    language: str,
    known: Known = computed,
) -> StageDiagnosis:
    """Try the bug catalogue on the numeric failures, smallest first (a few small forwards,
    only when something failed); else a bug a case's judge recognised by itself; else the
    lesson of the first error with a catalogued signature; else the first failure's own hint."""
    bad = [c for c in cases if c.status not in (Status.PASSED, Status.SKIPPED)]
    if not any(c.status in DIAGNOSED_STATUSES for c in bad):
        return StageDiagnosis()
    found = catalogue_match(failures, tolerance, recompute, known)
    name, hint = found.words(language, recompute.config)
    if name:
        ids = tuple(b.id for b in found.candidates)
        taught = Teaching(bad[0], name, hint, found.bug.id if found.bug else None, ids)
    else:
        numbers = numbers_shown(cases) if failures else ""
        taught = teaching_of_cases(bad, language, recompute, numbers)
    worst = worst_case(cases)
    return StageDiagnosis(
        suspected_bug=taught.suspected_bug,
        candidates=list(taught.candidates),
        bug_name=taught.bug_name,
        hint=taught.hint,
        lesson=next((c.lesson for c in bad if c.lesson), None),
        where=taught.case.where,
        first_case=taught.case.name,
        worst_case=worst.name if worst is not None and worst is not taught.case else None,
        shared_error=shares_one_error(cases),
        diagnosed=bool(failures),
    )


def teaching_of_cases(
    bad: list[CaseResult], language: str, recompute: Recompute, numbers: str = ""
) -> Teaching:
    """No bug matched the numbers: one a case's judge recognised, else an error's lesson,
    else what the failing numbers show (numbers.py: never a list of bugs that may not apply
    to the case), else the first failure's hint (never a hint taken from another failure)."""
    config = recompute.config
    for case in bad:
        if case.suspected_bug in bug_table():
            bug = bug_table()[case.suspected_bug]
            hint = f"{bug.hint(language, config)} {case.hint}".strip()
            return Teaching(case, bug.name(language, config), hint, bug.id, (bug.id,))
    for case in bad:
        if (found := lesson_for(case)) is not None:
            bug, signature = found
            hint = f"{signature.means} {bug.hint(language, config)}"
            return Teaching(case, bug.name(language, config), hint)
    if numbers:
        shown = next(c for c in bad if c.status == Status.FAILED and c.worst is not None)
        return Teaching(shown, hint=numbers)
    return Teaching(bad[0], hint=bad[0].hint)


def worst_case(cases: list[CaseResult]) -> CaseResult | None:
    """The failing case whose answer lands furthest past the tolerance."""
    scored = [c for c in cases if c.status == Status.FAILED and c.worst is not None]
    return max(scored, key=lambda c: c.worst) if scored else None
