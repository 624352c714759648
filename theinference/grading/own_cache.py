"""When a swapped case's answer is asked over the student's own cache, for the diagnosis.

A swapped case that departs is asked again over the student's own cache, where the stage's
diagnosis can name its bug: two calls for one failing case. A classic bug fails every case, so
right after a case that failed over its own cache the next small case is asked there first:
a bug's answer there has failed at the cost of one call; any other is then asked over the
swapped cache and judged there as a swap-first case is, a pass resting on that call alone
(grade_own_first).
"""

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from theinference.curriculum.checks import CHECKS, Check
from theinference.curriculum.checks.swap import SwapPlan, departs
from theinference.curriculum.stages import Case, Stage
from theinference.diagnosis.fingerprints import MAX_CASES, MIN_CASES
from theinference.grading.answers import Answers
from theinference.grading.judging import (
    OracleClock,
    Question,
    case_result,
    departed,
    fix_answer,
    judge,
    resolved,
    swaps,
)
from theinference.grading.policy import LONG_CASE_TOKENS, case_size
from theinference.results import Status
from theinference.student.channel import Probe
from theinference.student.process import StudentProcess
from theinference.student.replies import Outcome

# an answer over the student's own cache this many times the tolerance off is a bug's
NEAR_MISS = 10.0
ASKED_FIRST = (
    "(asked over your own cache first, where this stage last failed: a wrong answer there "
    "fails without the swap)"
)


def wanted_again(case, failing: int, settled: Callable[[], bool]) -> bool:
    """Whether an answer that departs over the swapped cache is asked again over the
    student's own cache, for the diagnosis: the catalogue confirms a bug on MIN_CASES failing
    answers and tells candidates apart on up to MAX_CASES of the smallest, so past MIN_CASES
    only while it has not `settled` on one bug; a long case past the first MIN_CASES would
    double a failing try's cost for little it does not know."""
    if failing < MIN_CASES:
        return True
    if failing >= MAX_CASES or case_size(case) > LONG_CASE_TOKENS:
        return False
    return not settled()


def wanted_first(case, failing: int, last_failed_own: bool, settled: Callable[[], bool]) -> bool:
    """Whether `case` is asked over the student's own cache before its swap: a small case,
    right after a case whose answer failed over its own cache (or first in a stage that
    failed in the course's last run: a bug is worked on over several saves), while the
    diagnosis still wants failing answers. A case that passes then costs one call more, once."""
    if not last_failed_own or case_size(case) > LONG_CASE_TOKENS:
        return False
    return wanted_again(case, failing, settled)


def asks_own_first(check: Check, case: Case) -> bool:
    """Whether the case could be asked over its own cache first: a swapped case judged on
    its answer alone (where a floor judges, its measured call is the evidence)."""
    return check.flop is None and swaps(check, case, measured=False)


def grade_own_first(stage: Stage, case: Case, process: StudentProcess, answers: Answers):
    """grade_case's (result, arguments, verdict) of a case asked over the student's own cache
    first (asks_own_first): a bug there is its verdict (over the swapped cache it would
    depart, and be asked again there); a right answer, or one that misses by little (a cache
    kept a little inexact, which the swap's exact K/V could bring within tolerance), is asked
    over the swapped cache, and judged there as a case asked swap first is."""
    check = CHECKS[case.check]
    args = check.arguments(case, answers.recompute.config)
    clock = OracleClock()
    fixed = fix_answer(case, args, answers, clock, measured=False)
    asked = Question(stage, case, args, answers, clock)
    outcome = process.call(check.adapter, args, stage.timeout, Probe(check.hook, check.watch))
    plan = resolved(fixed, clock)
    if not isinstance(plan, SwapPlan):  # none could be drawn: a swap-first call had none
        verdict = judge(asked, outcome, plan)
    else:
        verdict = judge(asked, outcome, plan, rerun=True)
        if verdict.status == Status.PASSED or (
            verdict.status == Status.FAILED and not is_bug(verdict)
        ):
            outcome, verdict = over_the_swap(asked, process, plan, (outcome, verdict))
        elif verdict.status == Status.FAILED:
            verdict.message = f"{verdict.message} {ASKED_FIRST}"
    return case_result(case, outcome, verdict, clock), args, verdict


def is_bug(verdict) -> bool:
    """A failure over the student's own cache that no swap could turn into a pass: a value
    rejected (its shape, its type), or numbers NEAR_MISS times the tolerance off or more (in
    any step of a sequence, not only the first that departs)."""
    worst = [c.worst for c in verdict.comparisons] + list(verdict.steps or [])
    return not verdict.comparisons or max(worst) >= NEAR_MISS


def over_the_swap(asked: Question, process: StudentProcess, plan: SwapPlan, own: tuple) -> tuple:
    """(outcome, verdict) of a case asked over the swapped cache after `own`, the (outcome,
    verdict) of its call over its own cache, right or a near miss: judged as a swap-first case
    whose departing answer was asked again. An answer over the swap that does not pass and
    could be one kept across calls (the answer with nothing swapped, no swap made, or the very
    value returned over its own cache) is asked once more in a fresh process, as a swap-first
    call is asked: nothing the student keeps across calls (an answer kept by its arguments,
    in any precision) stands in there for the decode; a retry that returns nothing leaves
    the first answer's verdict."""
    check, stage = CHECKS[asked.case.check], asked.stage
    outcome = process.call(check.adapter, asked.args, stage.timeout,
                           Probe(check.hook, check.watch, plan.answer))
    verdict = judge(asked, outcome, plan)
    if kept_across_calls(outcome, verdict, own[0]):
        process.stop()
        again = unused(plan)
        retried = process.call(check.adapter, asked.args, stage.timeout,
                               Probe(check.hook, check.watch, again.answer))
        if retried.kind == "returned":
            outcome, verdict = retried, judge(asked, retried, again)
    if not departs(verdict):
        return outcome, verdict
    return own[0], departed(own[1], stage)  # as a departing answer asked again is named


def kept_across_calls(outcome: Outcome, verdict, own: Outcome) -> bool:
    """Whether an answer over the swap could be one kept from the call before: a value that
    does not pass, and is the answer with nothing swapped, or came with no swap made, or is
    the very value returned over its own cache (an error or a timeout is not asked again)."""
    if outcome.kind != "returned" or verdict.status == Status.PASSED:
        return False
    return not departs(verdict) or same_value(outcome, own)


def same_value(swapped: Outcome, own: Outcome) -> bool:
    """Whether both calls returned the very same numbers (what a value kept across calls
    returns; a decode that read the swap's K/V returns others)."""
    try:
        return bool(np.array_equal(np.asarray(swapped.value), np.asarray(own.value)))
    except (TypeError, ValueError):  # values of no one shape: not numbers to compare
        return False


def unused(plan: SwapPlan) -> SwapPlan:
    """The plan as it was before any call heard of it (the same swap, asked again)."""
    return replace(plan, most=0, stale=0, calls=0, offered=False, sent=False, searched="",
                   search=None)
