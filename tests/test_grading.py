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
    assert not any(c.suspected_bug or c.fingerprinted for s in run.stages for c in s.cases)
    assert statuses(run) == {slug: "passed" for slug in ALL}
    worst = max(c.worst for s in run.stages for case in s.cases for c in case.comparisons)
    assert worst < 0.2  # far inside the tolerance, not scraping past it
    assert run.worker_startups == 1  # one student process served the whole run


@pytest.mark.slow
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


SMALL_CASE_TOKENS = 300  # a bug that fails the small cases fails the stage; big ones cost time


def small_cases(slug: str):
    """The stage with only its cases of at most SMALL_CASE_TOKENS tokens."""
    from dataclasses import replace

    from theinference.config import GPT2_124M
    from theinference.stages import load_stages, token_ids

    (stage,) = [s for s in load_stages() if s.slug == slug]

    def size(case) -> int:
        specs = [v for k, v in case.inputs.items() if k in ("seq", "prompt", "continuation")]
        specs += case.inputs.get("prompts", [])
        return sum(len(token_ids(spec, GPT2_124M)) for spec in specs)

    keep = [c for c in stage.cases if size(c) <= SMALL_CASE_TOKENS or "must_raise" in c.inputs]
    return replace(stage, cases=tuple(keep))


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_planted_bug_fails_its_stage_and_is_named(bug, tmp_path, weights):
    from theinference.formats import to_json
    from theinference.grader import grade
    from theinference.runner import Limits

    course = make_course(tmp_path / "c", bug.planted())
    run = grade(course, [small_cases(bug.stage)], weights, Limits(timeout=60))
    (stage,) = run.stages
    assert stage.status.value in ("failed", "error"), [c.message for c in stage.cases]
    failing = [c for c in stage.cases if c.status.value != "passed"]
    assert failing and all(c.message for c in failing)
    # numeric failures are far outside the tolerance, not borderline
    worst = [cmp.worst for c in failing for cmp in c.comparisons if not cmp.passed]
    assert all(w > 5 for w in worst), worst
    named = {c["suspected_bug"] for s in to_json(run)["stages"] for c in s["cases"]} - {None}
    if bug.fingerprint:
        assert named == {bug.fingerprint}, named
        assert any(c.hint.startswith("suspected bug:") for c in failing)
    else:
        assert not named, named  # the grader guesses nothing it cannot back


def test_failed_prerequisite_skips_dependents_with_reason(tmp_path, weights):
    bug = next(b for b in BUGS if b.id == "causal-mask-in-step")
    course = make_course(tmp_path / "c", bug.planted())
    run = grade_course(course, weights)
    assert statuses(run) == {"single-step-attention": "failed"} | {
        slug: "skipped" for slug in ALL[1:]
    }
    assert "requires single-step-attention" in run.stages[1].reason
