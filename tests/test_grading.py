"""End to end through the real template, worker and oracle: right answers pass, every classic
bug fails the stage it breaks, an untouched template is todo everywhere."""

import pytest

from tests.bugs import BUGS, REFERENCE, planted
from tests.helpers import STAGES, grade_course, make_course, statuses
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.stages import load_stages, with_run_draws
from theinference.grading.ahead import runs_alone
from theinference.oracle.config import GPT2_124M

ALL = STAGES


def test_reference_solution_passes_every_stage(reference_course, weights, answers, run_seed):
    run = grade_course(reference_course, weights, oracle=answers, seed=run_seed)
    assert not any(c.suspected_bug or c.lesson for s in run.stages for c in s.cases)
    assert not any(s.suspected_bug or s.bug_name or s.hint for s in run.stages)
    assert statuses(run) == {slug: "passed" for slug in ALL}
    worst = max(c.worst for s in run.stages for case in s.cases for c in case.comparisons)
    assert worst < 0.2  # far inside the tolerance, not scraping past it
    # one student process served the whole run, and one beside it, but for the calls alone in a
    # fresh process (and the one started after each): the refusals; the floors' measured cases,
    # whose swaps the reference follows, pass beside the others, never measured alone
    # (grading/swap_first.py)
    cases = [c for s in load_stages() for c in with_run_draws(s, 0).cases]
    assert sum(measured(c) for c in cases) >= 3  # the two cost proofs, a long generation
    alone = sum(runs_alone(c, GPT2_124M) for c in cases)
    assert 1 + alone <= run.worker_startups <= 2 + 2 * alone


def measured(case) -> bool:
    """Whether a floor judges the case (alone, where its swap proves nothing)."""
    from theinference.grading.judging import is_measured

    check = CHECKS[case.check]
    return is_measured(check, case, check.arguments(case, GPT2_124M), GPT2_124M)


# the independent solution passes every stage (its short cases and swaps) in
# tests/test_cache_layouts.py; the paged one the first three stages' every full-size case in
# tests/test_class_grade_slow.py


def test_untouched_template_is_todo_everywhere(template_course, weights, answers):
    run = grade_course(template_course, weights, oracle=answers)
    assert statuses(run) == {slug: "todo" for slug in ALL}
    first = run.stages[0].cases[0]
    assert "single-step-attention" in first.message and "kvcache.py" in first.message
    assert not run.passed


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_planted_bug_fails_its_stage_and_is_named(bug, weights, answers):
    # exactly what `theinference verify --quick` runs for each bug
    from theinference.curriculum.stages import load_stages
    from theinference.grading.verify import Grounds, quick, verify_bug
    from theinference.results.events import StageFinished

    (stage,) = [s for s in load_stages() if s.slug == bug.stage]
    finished = []

    def keep(event) -> None:
        if isinstance(event, StageFinished):
            finished.append(event.result)

    grounds = Grounds(weights, answers)
    row = verify_bug(bug, REFERENCE.read_text(), quick(stage), grounds, keep)
    assert row.status.value in ("failed", "error"), row
    assert row.named == bug.fingerprint, row  # named exactly, or (no fingerprint) not guessed
    assert row.ok
    if row.worst is not None:  # numeric failures land far outside the tolerance
        assert row.worst > (1 if bug.subtle else 5), row
    assert_localised_cases_carry_their_map(bug.id, finished[-1])


def assert_localised_cases_carry_their_map(bug_id: str, stage) -> None:
    """Every case a planted bug fails where the check localised it carries its error map, with
    the first departing cell where the check says (a cache's row label may add its tensor:
    "0 K"). Would catch a localised failure that reaches the student without its map."""
    from theinference.results import Status

    for case in stage.cases:
        if case.where is None or case.status != Status.FAILED:
            continue
        if "positions, expected" in case.message:  # a count of reused positions departs
            continue
        assert case.error_map is not None, (bug_id, case.name, case.where)
        for axis, label in case.error_map["first_at"].items():
            if axis in case.where:
                assert str(case.where[axis]) == label.split()[0], (bug_id, case.name)


def test_failed_prerequisite_skips_dependents_with_reason(tmp_path, weights, answers):
    course = make_course(tmp_path / "c", planted("causal-mask-in-step"))
    run = grade_course(course, weights, oracle=answers)
    assert statuses(run) == {"single-step-attention": "failed"} | {
        slug: "skipped" for slug in ALL[1:]
    }
    assert "requires single-step-attention" in run.stages[1].reason
