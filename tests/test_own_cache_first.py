"""A swapped case right after one that failed over the student's own cache is asked there
first (grading/own_cache.py): a classic bug costs each failing case one call, not a swapped
call and then the same call again; a pass still rests on the call over the swapped cache."""

from dataclasses import replace

import pytest

from tests.bugs import planted
from tests.helpers import make_course, reference_text
from theinference.curriculum.checks import Verdict
from theinference.curriculum.stages import load_stages, select
from theinference.grading.grader import RunPlan, grade
from theinference.grading.judging import UNASKED
from theinference.grading.own_cache import ASKED_FIRST, NEAR_MISS, is_bug, wanted_first
from theinference.grading.policy import RunPolicy
from theinference.results import Status
from theinference.results.compare import Comparison, Tolerance
from theinference.student.process import StudentProcess
from theinference.student.setup import Limits, ProcessSetup

CHOSEN = ("one-token", "token ids", "short prompt")

# a decode that never reads the cache it keeps: a recompute, right over its own cache, which
# only the call over the swapped cache can tell from a cached decode
RECOMPUTES = '''
_filled_prefill = prefill


def prefill(prompt_ids, w, mc):
    mc.ids = list(prompt_ids)
    return _filled_prefill(prompt_ids, w, mc)


def decode_step(token_id, position, w, mc):
    mc.ids.append(token_id)
    return recompute_logits(mc.ids, w)[-1]
'''

# the same, wrong after a one-token prompt: right over its own cache from the second case on
WRONG_FIRST_THEN_RECOMPUTES = RECOMPUTES + '''
_recomputed_step = decode_step


def decode_step(token_id, position, w, mc):
    logits = _recomputed_step(token_id, position, w, mc)
    return logits + 1.0 if len(mc.ids) == 2 else logits
'''


# the template's full-decode-step adapter, keeping each answer across calls (a correct shape:
# asked the same again, it answers from memory, with no prefill to follow and no cache read),
# kept as it was returned or in float16 (a value within tolerance, not the same bits)
KEPT_ACROSS_CALLS = """
import numpy as np

_answers = {}


def run_decode_step(prompt_ids, next_id):
    key = (tuple(prompt_ids), next_id)
    if key in _answers:
        return _answers[key]
    w = load_weights()
    mc = fresh_cache(w)
    prefill(prompt_ids, w, mc)
    logits = decode_step(next_id, len(prompt_ids), w, mc)
    _answers[key] = logits.astype(KEPT)
    return logits
"""

WRONG_AT_POSITION_ONE = """
_right_step = decode_step


def decode_step(token_id, position, w, mc):
    logits = _right_step(token_id, position, w, mc)
    return logits + 1.0 if position == 1 else logits
"""


# a cache kept a little inexact: the prompt's K a few parts in ten thousand off, so the answer
# over its own cache misses by a few times the tolerance (the swap writes exact K/V)
K_A_LITTLE_OFF = """
_exact_append = append_kv


def append_kv(cache, k, v):
    _exact_append(cache, k if k.shape[1] == 1 else k * np.float32(1 + 3e-4), v)
"""


def graded_with_calls(course, weights, monkeypatch, cases=CHOSEN, failed_before=()) -> tuple:
    """(full-decode-step's result on `cases`, each call's (first argument, swapped?)), the
    course's last run having failed the stages `failed_before`."""
    calls = []
    call = StudentProcess.call

    def counted(self, adapter, args, timeout, probe=None, *rest, **kw):
        calls.append((tuple(args[0]), probe is not None and probe.answer is not None))
        return call(self, adapter, args, timeout, probe, *rest, **kw)

    monkeypatch.setattr(StudentProcess, "call", counted)
    (stage,) = select(load_stages(), ["full-decode-step"])
    setup = ProcessSetup(course, weights.path, Limits(timeout=120))
    run = grade(setup, RunPlan([replace(stage, timeout=120)], weights,
                               policy=RunPolicy(cases=cases),
                               failed_before=frozenset(failed_before)))
    (result,) = run.stages
    return result, calls


def test_a_case_after_one_that_failed_over_its_own_cache_is_asked_once(
        tmp_path, weights, monkeypatch):
    """Catches a failing try that asks every failing case twice (over the swapped cache, then
    again over the student's own: per-step-identity's failing save was 1.09x its passing
    one), and a first case asked over its own cache before anything has failed (a passing
    save would pay every case twice)."""
    course = make_course(tmp_path / "course", planted("decode-position-zero"))
    result, calls = graded_with_calls(course, weights, monkeypatch)
    assert result.status == Status.FAILED and result.suspected_bug == "position-zero"
    assert [c.status for c in result.cases] == [Status.FAILED] * 3
    first, *rest = [[swapped for prompt, swapped in calls if prompt == p]
                    for p in dict.fromkeys(prompt for prompt, _ in calls)]
    assert first == [True, False], first  # swapped first: nothing had failed yet
    # the second asked once, over its own cache; the third once, swapped: the catalogue has
    # named the bug on two, and its departing answer is not asked again
    assert rest == [[False], [True]], rest
    unasked = UNASKED.split("{")[0]
    assert [c.message.startswith(unasked) for c in result.cases] == [False, False, True]
    assert result.cases[1].message.endswith(ASKED_FIRST)  # the report says how it was asked


def test_a_case_right_over_its_own_cache_after_a_failure_is_still_asked_over_the_swap(
        tmp_path, weights, monkeypatch):
    """Catches a case passed on its answer over the student's own cache: after a failing
    case, a decode that recomputes instead of reading its cache is right there, and only
    the call over the swapped cache shows it."""
    course = make_course(tmp_path / "course", reference_text() + WRONG_FIRST_THEN_RECOMPUTES)
    result, calls = graded_with_calls(course, weights, monkeypatch)
    first, second, third = result.cases
    assert first.status == Status.FAILED and first.message.endswith("(over the swapped cache too)")
    assert second.status == Status.FAILED and "recompute" in second.message, second.message
    assert third.status == Status.FAILED and "recompute" in third.message, third.message
    assert [s for _, s in calls][2:4] == [False, True], calls  # own cache, then the swap


def test_a_retry_in_a_fresh_process_that_returns_nothing_leaves_the_first_swaps_verdict(
        tmp_path, weights, monkeypatch):
    """Catches the swap's finding thrown away for the retry's crash: a decode that recomputes
    (right over its own cache, the same over the swap) and exits in a fresh process reads
    "recomputes", not a crash in a call the student never knew of."""
    crashes_when_fresh = """
_calls = [0]
_recomputing_step = decode_step


def decode_step(token_id, position, w, mc):
    _calls[0] += 1
    if _calls[0] == 1 and len(mc.ids) == 2:  # the first decode of a fresh process, case two
        import os

        os._exit(3)
    return _recomputing_step(token_id, position, w, mc)
"""
    code = reference_text() + WRONG_FIRST_THEN_RECOMPUTES + crashes_when_fresh
    course = make_course(tmp_path / "course", code)
    result, calls = graded_with_calls(course, weights, monkeypatch, CHOSEN[:2])
    second = result.cases[1]
    assert [s for p, s in calls if len(p) == 2] == [False, True, True], calls
    assert second.status == Status.FAILED and "recompute" in second.message, second.message


def test_an_error_over_the_swap_is_not_asked_again_in_a_fresh_process(
        tmp_path, weights, monkeypatch):
    """Catches an error or a timeout over the swap asked once more in a fresh process (a
    hang would cost its timeout twice; an error is the student's, whatever it kept)."""
    raises_when_asked_again = """
_asked = set()
_answering_step = decode_step


def decode_step(token_id, position, w, mc):
    if (position, token_id) in _asked and position == 2:  # the second case's decode
        raise RuntimeError("asked twice")
    _asked.add((position, token_id))
    return _answering_step(token_id, position, w, mc)
"""
    code = reference_text() + WRONG_AT_POSITION_ONE + raises_when_asked_again
    course = make_course(tmp_path / "course", code)
    result, calls = graded_with_calls(course, weights, monkeypatch, CHOSEN[:2])
    second = result.cases[1]
    assert [s for p, s in calls if len(p) == 2] == [False, True], calls
    assert second.status == Status.ERROR and "asked twice" in second.traceback, second


def test_an_answer_a_little_off_over_its_own_cache_is_judged_over_the_swap(
        tmp_path, weights, monkeypatch):
    """Catches a near miss over the student's own cache taken as the case's verdict: a cache
    kept a little inexact is judged over the swapped cache, as a swap-first case is (the
    swap's exact K/V could bring it within tolerance), its own miss then in the report."""
    code = reference_text() + WRONG_AT_POSITION_ONE + K_A_LITTLE_OFF
    course = make_course(tmp_path / "course", code)
    result, calls = graded_with_calls(course, weights, monkeypatch, CHOSEN[:2])
    first, second = result.cases
    assert "1e+03x" in first.message, first.message  # a bug's miss: swapped, then asked again
    assert "x the tolerance" in second.message and "1e+03x" not in second.message
    swapped = [s for prompt, s in calls if len(prompt) == 2]
    # its own cache, then the swap; not again in a fresh process: its answer over the swap
    # is not the one over its own cache, so no answer kept across calls stood in for it
    assert swapped == [False, True], calls
    assert ASKED_FIRST not in second.message, second.message


def test_only_a_small_case_right_after_a_failure_over_its_own_cache_is_asked_there_first():
    """Catches asking over the student's own cache first after a passing case or a failure
    only over the swapped cache (a cache-use bug: right over its own cache, each case would
    cost two calls), a long case asked there first (a long case that passes costs twice),
    and asking there once the diagnosis has all it reads."""
    (stage,) = select(load_stages(), ["full-decode-step"])
    small = next(c for c in stage.cases if c.name.startswith("one-token"))
    long = next(c for c in stage.cases if "(1023)" in c.name)
    named, open_question = (lambda: True), (lambda: False)
    assert wanted_first(small, 1, True, named) and wanted_first(small, 2, True, open_question)
    assert not wanted_first(small, 1, False, open_question)
    assert not wanted_first(long, 1, True, open_question)
    assert not wanted_first(small, 2, True, named)


@pytest.mark.parametrize("kept", ["np.float32", "np.float16"])
def test_a_case_whose_answer_is_kept_after_the_call_over_its_own_cache_still_passes(
        tmp_path, weights, monkeypatch, kept):
    """Catches a correct case failed for the order it was asked in: an adapter that keeps
    its answers across calls answers the same question again from memory, so right after its
    call over its own cache the swap finds nothing to follow; asked over the swap in a fresh
    process, as a swap-first call is, it passes, whether the kept answer is the same bits or
    only within tolerance."""
    course = make_course(tmp_path / "course", reference_text() + WRONG_AT_POSITION_ONE)
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text() + KEPT_ACROSS_CALLS.replace("KEPT", kept))
    result, calls = graded_with_calls(course, weights, monkeypatch)
    assert [c.status for c in result.cases] == [Status.FAILED, Status.PASSED, Status.PASSED], [
        c.message for c in result.cases]
    second = [swapped for prompt, swapped in calls if len(prompt) == 2]
    assert second == [False, True, True], calls  # its own cache, the swap, a fresh one


def test_a_bug_over_its_own_cache_is_a_rejected_value_or_a_miss_of_many_tolerances():
    """Catches a near miss taken for a bug (a cache kept a little inexact failed without the
    swap that could bring it within tolerance) and a bug's miss, or a rejected value, sent
    on to the swap (a failing case asked twice), a drift read from its first step alone."""

    def missing_by(worst: float) -> Verdict:
        tol = Tolerance(1e-3, 1e-2)
        c = Comparison("logits", (3,), 1, 3, 0.1, (0,), 0.1, (0,), worst, (0,), tol)
        return Verdict(Status.FAILED, message="", comparisons=[c])

    assert not is_bug(missing_by(2.0)) and not is_bug(missing_by(NEAR_MISS / 2))
    assert is_bug(missing_by(NEAR_MISS)) and is_bug(missing_by(1e3))
    assert is_bug(Verdict(Status.FAILED, message="the value is not an array"))
    drifting = missing_by(2.0)  # its first departing step a near miss, a later one a bug's
    drifting.steps = [0.5, 2.0, 40.0]
    assert is_bug(drifting)


@pytest.mark.parametrize("failed_before", [(), ("full-decode-step",)])
def test_a_stage_that_failed_last_run_asks_its_first_case_over_its_own_cache_first(
        tmp_path, weights, monkeypatch, failed_before):
    """Catches a stage worked on over several failing saves paying its first failing case
    twice at every save (swapped, then asked again over its own cache: per-step-identity's
    failing save 1.05x its passing one), and the stage's first case asked over its own
    cache first where nothing said it failed (a passing save would pay a call more)."""
    course = make_course(tmp_path / "course", planted("decode-position-zero"))
    result, calls = graded_with_calls(course, weights, monkeypatch, CHOSEN[:1], failed_before)
    assert result.cases[0].status == Status.FAILED
    assert [swapped for _, swapped in calls] == ([False] if failed_before else [True, False])
    assert result.cases[0].message.endswith(ASKED_FIRST) == bool(failed_before)


def test_a_stage_fixed_since_its_failed_run_passes_on_the_call_over_the_swap(
        tmp_path, weights, monkeypatch):
    """Catches a first case passed on its answer over the student's own cache because the
    stage failed last time: a right answer there is asked over the swapped cache, whose
    call alone passes it (a decode that recomputes is right over its own cache too)."""
    fixed = make_course(tmp_path / "fixed", reference_text())
    result, calls = graded_with_calls(fixed, weights, monkeypatch, CHOSEN[:1], ["full-decode-step"])
    assert result.status == Status.PASSED
    assert [swapped for _, swapped in calls] == [False, True]
    recomputes = make_course(tmp_path / "recomputes", reference_text() + RECOMPUTES)
    result, _ = graded_with_calls(recomputes, weights, monkeypatch, CHOSEN[:1],
                                 ["full-decode-step"])
    assert result.status == Status.FAILED, result.cases[0].message



def test_the_stages_a_course_last_failed_are_read_from_its_progress(tmp_path):
    """Catches the stages a run starts asking over the student's own cache taken from
    anything but a failure on numbers in the course's last recorded run (an error, a pass,
    a todo, a damaged entry), and a damaged progress file stopping a run."""
    from theinference.grading.progress import PROGRESS_FILE, failed_stages

    (tmp_path / PROGRESS_FILE).parent.mkdir()
    (tmp_path / PROGRESS_FILE).write_text(
        '{"version": 1, "stages": {"a": {"status": "failed"}, "b": {"status": "passed"},'
        ' "c": {"status": "error"}, "d": "failed", "e": {"status": ["failed"]}}}')
    assert failed_stages(tmp_path) == frozenset({"a"})
    (tmp_path / PROGRESS_FILE).write_text("{not json")
    assert failed_stages(tmp_path) == frozenset()
    assert failed_stages(tmp_path / "absent") == frozenset()


def test_a_second_failing_save_asks_its_first_case_over_its_own_cache_first(tmp_path, weights):
    """Catches the course's last run not reaching the next run (`theinference test` and
    every watch rerun read it from the progress the run before recorded)."""
    from theinference.grading.session import LimitRequest, RunRequest, prepare, run

    course = make_course(tmp_path / "course", planted("decode-position-zero"))
    request = RunRequest(stages=("full-decode-step",), policy=RunPolicy(cases=CHOSEN[:1]),
                         limits=LimitRequest(timeout=120))
    first, second = (run(prepare(course, request)).stages[0] for _ in range(2))
    assert first.status == second.status == Status.FAILED
    assert not first.cases[0].message.endswith(ASKED_FIRST)
    assert second.cases[0].message.endswith(ASKED_FIRST), second.cases[0].message
