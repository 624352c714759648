"""A stage's points under the course's [grading], read from its StageResult: its public cases
and its seeded hidden ones, each group worth its share of the stage's points (by case count),
scored all or nothing or, with partial credit, by the share of its cases that passed.

One scoring for everything that scores: Gradescope's results.json (output/gradescope.py) and
the gradebook (classroom/records.py) read `scored_groups` and `stage_score`; neither computes
a score of its own."""

from dataclasses import dataclass, replace

from theinference.course.settings import Grading
from theinference.results import SEVERITY, CaseResult, StageResult, Status


@dataclass(frozen=True)
class CaseGroup:
    """A stage's public cases, or its hidden ones, with their share of its points."""

    hidden: bool
    cases: list[CaseResult]
    points: float
    status: Status  # the worst of its cases'
    score: float = 0.0  # set by scored_groups
    full_marks: bool = False  # every point earned, every case passed


def stage_points(stages: list[StageResult], grading: Grading) -> dict[str, float]:
    """slug -> max score of each stage graded: [grading] scores, else the stage spec's."""
    return {s.slug: grading.points(s.slug, s.score_weight) for s in stages}


def is_hidden(case: CaseResult) -> bool:
    return case.hidden or case.name.startswith("hidden case")


def case_groups(stage: StageResult, max_score: float) -> list[CaseGroup]:
    """A stage's public cases and its seeded hidden ones, each worth its share of the points
    (by case count), so hidden cases count without revealing them before publication."""
    cases = stage.cases
    public = [c for c in cases if not is_hidden(c)]
    hidden = [c for c in cases if is_hidden(c)]
    if not hidden:
        return [CaseGroup(False, cases, max_score, stage.status)]
    share = max_score * len(hidden) / len(cases)
    return [
        CaseGroup(False, public, max_score - share, worst_status(public, stage.status)),
        CaseGroup(True, hidden, share, worst_status(hidden, Status.PASSED)),
    ]


def worst_status(cases: list[CaseResult], default: Status) -> Status:
    statuses = {c.status for c in cases}
    return next((s for s in SEVERITY if s in statuses), default)


def scored_groups(stage: StageResult, max_score: float, grading: Grading,
                  partial_earns: bool = False) -> list[CaseGroup]:
    """The stage's case groups, each with its `score` and whether it earned every point. A
    partial run (a student's --case, a stopped run) left cases out: it earns nothing, unless
    the instructor chose the cases (`partial_earns`: `grade --case`)."""
    scored = []
    for group in case_groups(stage, max_score):
        earns = partial_earns or not stage.partial
        score = round(group_score(group, grading), 4) if earns else 0.0
        full = score >= group.points and group.status == Status.PASSED
        scored.append(replace(group, score=score, full_marks=full))
    return scored


def stage_score(stage: StageResult, max_score: float, grading: Grading) -> float:
    """A gradebook row's score: `grade --case` is the instructor's choice of cases, so they
    earn their points."""
    groups = scored_groups(stage, max_score, grading, partial_earns=True)
    return round(sum(g.score for g in groups), 4)


def group_score(group: CaseGroup, grading: Grading) -> float:
    """All or nothing, or (partial_credit) the share of its cases that passed."""
    cases, points = group.cases, group.points
    passed = sum(c.status == Status.PASSED for c in cases)
    if group.status == Status.PASSED and passed == len(cases):
        return points
    if grading.partial_credit and cases:
        return points * passed / len(cases)
    return 0.0


def suspected_bug_of(stage: StageResult) -> str | None:
    """The stage's diagnosis where the results carry one, else its first case's."""
    return first_suspected_bug(stage.suspected_bug, stage.cases)


def first_suspected_bug(named: str | None, cases: list[CaseResult]) -> str | None:
    """`named` (a stage's diagnosis), else the first bug one of the cases' own judges saw."""
    return named or next((c.suspected_bug for c in cases if c.suspected_bug), None)
