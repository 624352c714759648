"""Results are plain values, built once and complete by the grader: every output (the terminal,
the watch screen, JSON, JUnit, Gradescope, the class report) reads these and works nothing out.
Where a run comes from its JSON (a class's grading, `summary`), json_form.py reads it back as
these very values."""

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


# a stage takes the status of its worst case, in this order (the one statement of it)
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
    where: dict | None = None  # where the answer first departs, e.g. {"step": 3, "position": 9}
    error_map: dict | None = None  # where it departs, as a grid (results/error_map.py)


def finding_of(found: Finding) -> dict:
    """The Finding fields of a verdict (or anything built on Finding), by name."""
    return {f.name: getattr(found, f.name) for f in fields(Finding)}


@dataclass(kw_only=True)
class CaseResult(Finding):
    """One case, judged: the finding plus what the student's call left behind."""

    name: str
    lesson: str | None = None  # the bug id whose error signature this case's error matches
    traceback: str = ""
    stdout: str = ""
    stderr: str = ""
    student_seconds: float = 0.0
    oracle_seconds: float = 0.0
    hidden: bool = False  # a seeded hidden case: its inputs are not shown before publication

    @property
    def worst(self) -> float | None:
        """Its largest error, in tolerances (None: nothing was compared)."""
        return max((c.worst for c in self.comparisons), default=None)


@dataclass
class StageResult:
    slug: str
    title: str
    status: Status
    cases: list[CaseResult] = field(default_factory=list)
    reason: str = ""  # why skipped
    seconds: float = 0.0
    score_weight: float = 1.0  # the stage spec's `score`, for Gradescope
    partial: bool = False  # only some of its cases ran (--case, --quick, stopped early)
    not_run: list[str] = field(default_factory=list)  # cases left out or stopped before
    # the diagnosis, resolved by the grader (diagnosis/stage.py) for a stage that did not pass
    suspected_bug: str | None = None  # a bug id of bugs.toml
    candidates: list[str] = field(default_factory=list)  # every bug id that explains it
    bug_name: str = ""  # the suspected bug, its candidates or the error lesson, in words
    hint: str = ""  # what to do: the diagnosis's hint, else that of the first case shown
    lesson: str | None = None  # the bug id an error's signature names
    where: dict | None = None  # where the first case shown departs
    first_case: str | None = None  # the case to show in full
    worst_case: str | None = None  # the failing case furthest past the tolerance, if another
    shared_error: bool = False  # every case that did not pass raised the same error
    diagnosed: bool = False  # the bug catalogue was tried on its failing answers

    def case(self, name: str | None) -> CaseResult | None:
        return next((c for c in self.cases if c.name == name), None)

    def speaks_for(self, case: CaseResult) -> bool:
        """The stage's diagnosis replaces the case's own hint: a bug is named, or the
        catalogue was tried on the case's failing numbers and the diagnosis says what they
        show (a case's own hint may list bugs that cannot apply to it)."""
        tried = self.diagnosed and case.status == Status.FAILED and case.worst is not None
        return bool(self.bug_name) or tried


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
    sandbox: str = "none"  # how the student's process ran: bwrap | unprivileged-user | none
    cpu_account: str = "none"  # what counted its CPU: cgroup-v2 | cgroup-v1 | seccomp | none
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


def where_text(where: dict | None) -> str:
    """{"layer": 2, "tensor": "K", "position": 0} -> "layer 2, tensor K, position 0"."""
    return ", ".join(f"{key} {value}" for key, value in (where or {}).items())
