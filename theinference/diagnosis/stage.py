"""A stage's diagnosis: which catalogued bug explains its failing answers, named once per
stage (the cases keep only what their own judge recognised)."""

from dataclasses import dataclass, field

import numpy as np

from theinference.curriculum.stages import Stage
from theinference.diagnosis.fingerprints import BY_ID, diagnose
from theinference.oracle.recompute import Recompute
from theinference.results import CaseResult


@dataclass(frozen=True)
class Failure:
    """A failing case whose numbers the bug catalogue can be tried on."""

    check: str
    args: list
    actual: np.ndarray


@dataclass(frozen=True)
class StageDiagnosis:
    suspected_bug: str | None = None
    candidates: list[str] = field(default_factory=list)
    hint: str = ""
    diagnosed: bool = False  # the catalogue was tried


def diagnose_stage(
    stage: Stage, failures: list[Failure], cases: list[CaseResult], recompute: Recompute
) -> StageDiagnosis:
    """Try the bug catalogue on the numeric failures, smallest first (a few small forwards,
    only when something failed); else take a bug a case's judge recognised by itself."""
    recognised = next((c.suspected_bug for c in cases if c.suspected_bug in BY_ID), None)
    if not failures:
        return with_bug(recognised, diagnosed=False)
    config = recompute.config
    ordered = sorted(failures, key=lambda f: len(str(f.args)))
    found = diagnose(
        [(f.check, f.args, f.actual) for f in ordered], stage.tolerance, recompute.w, config
    )
    if found.hint:  # one bug, candidates with the same numbers, or several bugs at once
        bug_id = found.bug.id if found.bug else None
        return StageDiagnosis(bug_id, [b.id for b in found.candidates], found.hint, True)
    return with_bug(recognised, diagnosed=True)


def with_bug(bug_id: str | None, diagnosed: bool) -> StageDiagnosis:
    if bug_id is None:
        return StageDiagnosis(diagnosed=diagnosed)
    bug = BY_ID[bug_id]
    return StageDiagnosis(
        bug.id, [bug.id], f"suspected bug: {bug.name}. {bug.hint}", diagnosed=diagnosed
    )
