"""A swapped case right after one that failed over the student's own cache is asked there
first (grading/own_cache.py): a classic bug costs each failing case one call, not a swapped
call and then the same call again; a pass still rests on the call over the swapped cache."""

from dataclasses import replace

from tests.bugs import planted
from tests.helpers import make_course, reference_text
from theinference.curriculum.stages import load_stages, select
from theinference.grading.grader import RunPlan, grade
from theinference.grading.judging import UNASKED
from theinference.grading.own_cache import wanted_first
from theinference.grading.policy import RunPolicy
from theinference.results import Status
from theinference.student.process import StudentProcess
from theinference.student.setup import Limits, ProcessSetup

CHOSEN = ("one-token", "token ids", "short prompt")

# right over its own cache from the second case on, but its decode never reads the cache it
# keeps: a recompute, which only the call over the swapped cache can tell from a cached decode
WRONG_FIRST_THEN_RECOMPUTES = '''
_filled_prefill = prefill


def prefill(prompt_ids, w, mc):
    mc.ids = list(prompt_ids)
    return _filled_prefill(prompt_ids, w, mc)


def decode_step(token_id, position, w, mc):
    mc.ids.append(token_id)
    logits = recompute_logits(mc.ids, w)[-1]
    return logits + 1.0 if len(mc.ids) == 2 else logits  # wrong after a one-token prompt
'''


# the template's full-decode-step adapter, keeping each answer across calls (a correct shape:
# asked the same again, it answers from memory, with no prefill to follow and no cache read)
KEPT_ACROSS_CALLS = """
_answers = {}


def run_decode_step(prompt_ids, next_id):
    key = (tuple(prompt_ids), next_id)
    if key not in _answers:
        w = load_weights()
        mc = fresh_cache(w)
        prefill(prompt_ids, w, mc)
        _answers[key] = decode_step(next_id, len(prompt_ids), w, mc)
    return _answers[key]
"""

WRONG_AT_POSITION_ONE = """
_right_step = decode_step


def decode_step(token_id, position, w, mc):
    logits = _right_step(token_id, position, w, mc)
    return logits + 1.0 if position == 1 else logits
"""


def graded_with_calls(course, weights, monkeypatch) -> tuple:
    """(full-decode-step's result on CHOSEN, each call's (first argument, swapped?))."""
    calls = []
    call = StudentProcess.call

    def counted(self, adapter, args, timeout, probe=None, *rest, **kw):
        calls.append((tuple(args[0]), probe is not None and probe.answer is not None))
        return call(self, adapter, args, timeout, probe, *rest, **kw)

    monkeypatch.setattr(StudentProcess, "call", counted)
    (stage,) = select(load_stages(), ["full-decode-step"])
    setup = ProcessSetup(course, weights.path, Limits(timeout=120))
    run = grade(setup, RunPlan([replace(stage, timeout=120)], weights,
                               policy=RunPolicy(cases=CHOSEN)))
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


def test_a_case_whose_answer_is_kept_after_the_call_over_its_own_cache_still_passes(
        tmp_path, weights, monkeypatch):
    """Catches a correct case failed for the order it was asked in: an adapter that keeps
    its answers across calls answers the same question again from memory, so right after its
    call over its own cache the swap finds nothing to follow; asked over the swap in a fresh
    process, as a swap-first call is, it passes."""
    course = make_course(tmp_path / "course", reference_text() + WRONG_AT_POSITION_ONE)
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text() + KEPT_ACROSS_CALLS)
    result, calls = graded_with_calls(course, weights, monkeypatch)
    assert [c.status for c in result.cases] == [Status.FAILED, Status.PASSED, Status.PASSED], [
        c.message for c in result.cases]
    second = [swapped for prompt, swapped in calls if len(prompt) == 2]
    assert second == [False, True, True], calls  # its own cache, the swap, a fresh one
