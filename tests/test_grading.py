"""End to end through the real template, worker and oracle: right answers pass, every classic
bug fails the stage it breaks, an untouched template is todo everywhere."""

import pytest

from tests.bugs import BUGS
from tests.helpers import SOLUTIONS, grade_course, make_course, statuses

ALL = [
    "single-step-attention",
    "build-prefill",
    "full-decode-step",
    "per-step-identity",
    "generate-loop",
    "prefix-caching",
]


def test_reference_solution_passes_every_stage(reference_course, weights):
    run = grade_course(reference_course, weights)
    assert statuses(run) == {slug: "passed" for slug in ALL}
    worst = max(c.worst for s in run.stages for case in s.cases for c in case.comparisons)
    assert worst < 0.2  # far inside the tolerance, not scraping past it
    assert run.worker_startups == 1  # one student process served the whole run


def test_independent_solution_passes_every_stage(tmp_path, weights):
    course = make_course(tmp_path / "c", (SOLUTIONS / "independent_kvcache.py").read_text())
    run = grade_course(course, weights)
    assert statuses(run) == {slug: "passed" for slug in ALL}


def test_untouched_template_is_todo_everywhere(template_course, weights):
    run = grade_course(template_course, weights)
    assert statuses(run) == {slug: "todo" for slug in ALL}
    first = run.stages[0].cases[0]
    assert "single-step-attention" in first.message and "kvcache.py" in first.message
    assert not run.passed


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_planted_bug_fails_its_stage(bug, tmp_path, weights):
    course = make_course(tmp_path / "c", bug.planted())
    run = grade_course(course, weights, [bug.stage])
    (stage,) = run.stages
    assert stage.status.value in ("failed", "error"), [c.message for c in stage.cases]
    failing = [c for c in stage.cases if c.status.value != "passed"]
    assert failing and all(c.message for c in failing)
    # numeric failures are far outside the tolerance, not borderline
    worst = [cmp.worst for c in failing for cmp in c.comparisons if not cmp.passed]
    assert all(w > 5 for w in worst), worst


def test_failed_prerequisite_skips_dependents_with_reason(tmp_path, weights):
    bug = next(b for b in BUGS if b.id == "causal-mask-in-step")
    course = make_course(tmp_path / "c", bug.planted())
    run = grade_course(course, weights)
    assert statuses(run) == {
        "single-step-attention": "failed",
        "build-prefill": "skipped",
        "full-decode-step": "skipped",
    }
    assert "requires single-step-attention" in run.stages[1].reason
