"""Results are plain values: every output format (terminal, JSON, JUnit) reads these."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NumPy stays out of the command line's start-up
    from theinference.results.compare import Comparison


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    TODO = "todo"  # the adapter raised NotImplementedError: not started
    ERROR = "error"  # import or call raised, or the process crashed
    TIMEOUT = "timeout"
    SKIPPED = "skipped"  # a prerequisite did not pass


# a stage takes the status of its worst case, in this order
SEVERITY = [Status.ERROR, Status.TIMEOUT, Status.FAILED, Status.TODO, Status.SKIPPED, Status.PASSED]


@dataclass
class Finding:
    """What judging one case found: a check's verdict and the case's result share these."""

    status: Status
    message: str = ""
    hint: str = ""
    comparisons: list[Comparison] = field(default_factory=list)
    steps: list[float] | None = None  # worst error per step, in tolerances
    tokens: dict | None = None  # generate-loop: yours, expected, first_divergence
    suspected_bug: str | None = None  # a catalogued bug id the judge recognised by itself


def finding_of(found: Finding) -> dict:
    """The Finding fields of a verdict (or anything built on Finding), by name."""
    return {f.name: getattr(found, f.name) for f in fields(Finding)}


@dataclass(kw_only=True)
class CaseResult(Finding):
    """One case, judged: the finding plus what the student's call left behind."""

    name: str
    fingerprinted: bool = False  # the judge recognised a catalogued bug by itself
    traceback: str = ""
    stdout: str = ""
    stderr: str = ""
    student_seconds: float = 0.0
    oracle_seconds: float = 0.0
    hidden: bool = False  # a seeded hidden case: its inputs are not shown before publication


@dataclass
class StageResult:
    slug: str
    title: str
    status: Status
    cases: list[CaseResult] = field(default_factory=list)
    reason: str = ""  # why skipped
    seconds: float = 0.0
    score_weight: float = 1.0  # the stage spec's `score`, for Gradescope
    suspected_bug: str | None = None  # the stage's diagnosis: a catalogued bug id
    candidates: list[str] = field(default_factory=list)  # every bug id that explains it
    hint: str = ""  # the diagnosis's hint, or the stage's hint for its worst failure
    diagnosed: bool = False  # the bug catalogue was tried on its failing answers
    partial: bool = False  # only some of its cases ran (--case, --quick, stopped early)
    not_run: list[str] = field(default_factory=list)  # cases left out or stopped before


@dataclass
class RunResult:
    stages: list[StageResult]
    weights_label: str
    weights_sha256: str
    seconds: float = 0.0
    worker_startups: int = 0
    worker_startup_seconds: float = 0.0
    cancelled: bool = False  # watch mode: a save arrived mid-run, results are incomplete
    environment: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. the oracle cache switched off
    sandbox: str = "none"  # bwrap | unprivileged-user | none: how the student's process ran
    provenance: dict = field(default_factory=dict)  # what produced it (grading/provenance.py)
    speed: dict | None = None  # the cached generation against the oracle's (grading/speed.py)

    @property
    def student_seconds(self) -> float:
        return sum(c.student_seconds for s in self.stages for c in s.cases)

    @property
    def oracle_seconds(self) -> float:
        return sum(c.oracle_seconds for s in self.stages for c in s.cases)

    @property
    def partial(self) -> bool:
        """Some stage ran only some of its cases: a pass here is not a full pass."""
        return self.cancelled or any(s.partial for s in self.stages)

    @property
    def passed(self) -> bool:
        return all(s.status == Status.PASSED for s in self.stages)


def stage_status(cases: list[CaseResult]) -> Status:
    statuses = {c.status for c in cases}
    return next((s for s in SEVERITY if s in statuses), Status.PASSED)
