"""A swapped call that begins before its plan is made: the decode stages' calls (no floor) as
the measured ones already did, the plan a begun call needs made next, the time the student's
process waits on the grader's answer not charged to its timeout, and a run's processes closed
at once."""

import sys
import threading
import time as clock
from dataclasses import replace

import pytest

from tests.helpers import make_course, reference_text, slowed_plans
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.checks.swap import FOLLOWED, SwapPlan
from theinference.curriculum.stages import load_stages
from theinference.results import Status
from theinference.student.setup import Limits, ProcessSetup

PLAN_SECONDS = 1.5  # an oracle slower than the student's prefill of a short prompt


def decode_stage(timeout: float = 60.0):
    """full-decode-step with its swapped proof case alone."""
    (stage,) = [s for s in load_stages() if s.slug == "full-decode-step"]
    cases = [c for c in stage.cases if c.check == "decode_cache_use"][:1]
    return replace(stage, cases=cases, timeout=timeout)


def graded(course, weights, answers, stage):
    from theinference.grading.grader import RunPlan, grade

    setup = ProcessSetup(course, weights.path, Limits(timeout=stage.timeout))
    run = grade(setup, RunPlan([stage], weights, answers, seed=11))
    (case,) = run.stages[0].cases
    return case


def test_a_decodes_swapped_call_begins_before_its_plan_is_made(
    tmp_path, weights, answers, monkeypatch
):
    """Catches a decode stage's call (no floor) that waits for its swap plan before it
    begins: a stage's first case waited a third of a second for the oracle's first plan (it
    reads the weights) with the student's process idle; and a swap lost when its plan comes
    only once the call has begun."""
    made_at, began_at = slowed_plans(monkeypatch, "run_decode_step", PLAN_SECONDS)
    course = make_course(tmp_path / "c", reference_text())
    case = graded(course, weights, answers, decode_stage())
    assert case.status == Status.PASSED, case.message
    assert case.message.startswith(FOLLOWED.split(":")[0]), case.message
    assert began_at and made_at and began_at[0] < made_at[0], (began_at, made_at)


def test_the_graders_answering_time_is_not_charged_to_the_calls_timeout(
    tmp_path, weights, answers, monkeypatch
):
    """Catches a call timed out while the student's process waited on the grader (its swap's
    plan still being made, a search): a correct decode of a short prompt, a timeout of two
    seconds, its plan made three seconds after the call began."""
    made_at, began_at = slowed_plans(monkeypatch, "run_decode_step", 3.0)
    course = make_course(tmp_path / "c", reference_text())
    case = graded(course, weights, answers, decode_stage(timeout=2.0))
    assert case.status == Status.PASSED, case.message
    assert began_at[0] < made_at[0], "the call waited for its plan before it began"


def test_the_plan_a_begun_call_wants_is_made_next():
    """Catches a planner that makes its plans in the cases' order whatever the calls need: a
    long case taken beside the small ones waited, inside its call, for every small case's plan
    before its own."""
    from theinference.grading.ahead import Planner

    planner = Planner.__new__(Planner)
    planner.answers = type("Answers", (), {"wanted_now": lambda self: [("b",), ("c",)]})()
    left = [(None, [], 0, ("a",)), (None, [], 0, ("c",)), (None, [], 0, ("b",))]
    assert planner.next_of(left) == 2, "the first wanted is not made first"
    assert planner.next_of(left[:2]) == 1
    assert planner.next_of(left[:1]) == 0, "none wanted: the running order"


def test_the_plans_wanted_change_under_the_planner_without_breaking_it():
    """Catches the planner reading the plans wanted while calls' threads add and drop them
    (an IndexError, a StopIteration or a ValueError in its thread: a traceback on the
    student's screen, and every later plan made in the run's own thread)."""
    from theinference.grading.ahead import Planner
    from theinference.grading.answers import Answers, plan_key

    answers = Answers.__new__(Answers)  # its plans' bookkeeping alone: no weights needed
    answers.wanted, answers.wanting = [], threading.Lock()
    planner = Planner.__new__(Planner)
    planner.answers = answers
    names = [f"check{n}" for n in range(64)]
    left = [(None, [], 0, plan_key(name, [], 0)) for name in names]
    stop, failed = threading.Event(), []

    def churn():
        while not stop.is_set():
            for name in reversed(names):
                answers.want(name, [], 0)
            for name in names:
                answers.unwant(plan_key(name, [], 0))

    thread = threading.Thread(target=churn)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns often: the race, if any, shows
    thread.start()
    try:
        deadline = clock.monotonic() + 1.0
        while clock.monotonic() < deadline and not failed:
            try:
                assert 0 <= planner.next_of(left) < len(left)
            except Exception as exc:  # noqa: BLE001 (what the test looks for)
                failed.append(exc)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switching)
    assert not failed, failed


def test_a_pending_plan_the_planner_never_made_is_made_when_needed(weights, answers):
    """Catches a call begun on a plan the planner then did not make (it stopped: a weights
    error, a closed stage) left with no swap: a decode stage has no floor to fall back on, so
    its proof would be lost; the plan is made at the moment instead."""
    from theinference.grading.judging import planned_or_made

    check = CHECKS["decode_cache_use"]
    plan, seconds = planned_or_made(check, [[464, 2068, 7586], 318], 3, answers)
    assert isinstance(plan, SwapPlan) and plan.hook == "prefill", plan
    assert seconds > 0


def test_a_runs_processes_are_closed_at_once():
    """Catches processes closed one after another at a run's end (each close looks at its
    tree until it is quiet: a few hundredths of a second each, added to every run), and a
    close that stops the others when one raises."""
    from theinference.grading.beside import close_all

    spans: list = []
    lock = threading.Lock()

    class Process:
        def __init__(self, fails: bool = False):
            self.fails = fails

        def close(self):
            began = clock.monotonic()
            clock.sleep(0.3)
            with lock:
                spans.append((began, clock.monotonic()))
            if self.fails:
                raise OSError("a close that failed")

    with pytest.raises(OSError, match="a close that failed"):
        close_all([Process(), Process(fails=True), Process()])
    assert len(spans) == 3, "a process was left unclosed"
    assert max(b for b, _ in spans) < min(e for _, e in spans), f"closed in turn: {spans}"
