"""A stage's points under the course's [grading], read from the results JSON: its public cases
and its seeded hidden ones, each group worth its share of the stage's points (by case count),
scored all or nothing or, with partial credit, by the share of its cases that passed.

One scoring for everything that scores: Gradescope's results.json (output/gradescope.py) and
the gradebook (classroom/records.py) read `scored_groups` and `stage_score`; neither computes
a score of its own."""

from theinference.course.settings import Grading
from theinference.results import SEVERITY, StageResult


def stage_points(stages: list[StageResult], grading: Grading) -> dict[str, float]:
    """slug -> max score of each stage graded: [grading] scores, else the stage spec's."""
    return {s.slug: grading.points(s.slug, s.score_weight) for s in stages}


def is_hidden(case: dict) -> bool:
    return bool(case.get("hidden")) or case.get("name", "").startswith("hidden case")


def case_groups(stage: dict, max_score: float) -> list[dict]:
    """A stage's public cases and its seeded hidden ones, each worth its share of the points
    (by case count), so hidden cases count without revealing them before publication."""
    cases = stage.get("cases", [])
    public = [c for c in cases if not is_hidden(c)]
    hidden = [c for c in cases if is_hidden(c)]
    if not hidden:
        return [{"hidden": False, "cases": cases, "points": max_score, "status": stage["status"]}]
    share = max_score * len(hidden) / len(cases)
    return [
        {"hidden": False, "cases": public, "points": max_score - share,
         "status": worst_status(public, stage["status"])},
        {"hidden": True, "cases": hidden, "points": share,
         "status": worst_status(hidden, "passed")},
    ]  # fmt: skip


def worst_status(cases: list[dict], default: str) -> str:
    statuses = {c["status"] for c in cases}
    return next((s.value for s in SEVERITY if s.value in statuses), default)


def scored_groups(stage: dict, max_score: float, grading: Grading,
                  partial_earns: bool = False) -> list[dict]:
    """The stage's case groups, each with its `score` and whether it earned every point. A
    partial run (a student's --case, a stopped run) left cases out: it earns nothing, unless
    the instructor chose the cases (`partial_earns`: `grade --case`)."""
    scored = []
    for group in case_groups(stage, max_score):
        earns = partial_earns or not stage.get("partial")
        score = round(group_score(group, grading), 4) if earns else 0.0
        full = score >= group["points"] and group["status"] == "passed"
        scored.append({**group, "score": score, "full_marks": full})
    return scored


def stage_score(stage: dict, max_score: float, grading: Grading) -> float:
    """A gradebook row's score: `grade --case` is the instructor's choice of cases, so they
    earn their points."""
    groups = scored_groups(stage, max_score, grading, partial_earns=True)
    return round(sum(g["score"] for g in groups), 4)


def group_score(group: dict, grading: Grading) -> float:
    """All or nothing, or (partial_credit) the share of its cases that passed."""
    cases, points = group["cases"], group["points"]
    if group["status"] == "passed" and all(c["status"] == "passed" for c in cases):
        return points
    if grading.partial_credit and cases:
        return points * sum(c["status"] == "passed" for c in cases) / len(cases)
    return 0.0


def suspected_bug_of(stage: dict) -> str | None:
    """The stage's diagnosis where the results carry one, else its first case's."""
    if stage.get("suspected_bug"):
        return stage["suspected_bug"]
    return next(
        (c["suspected_bug"] for c in stage.get("cases", []) if c.get("suspected_bug")), None
    )
