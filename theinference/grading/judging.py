"""One case: ask the student's process, then judge what came back against the oracle's answers.

The oracle's swap plans are made in a thread beside the student's short unmeasured calls
(ahead.py: each side's BLAS on one thread); every other answer is made before or after the
student's call, never beside it. Where the question is the call's own arguments, its answer
is fixed before the call starts, so nothing the call does can change what it is judged
against; generate-loop asks along the student's own tokens, after the call, from answers
held where the student cannot write.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from theinference.curriculum.checks import CHECKS, Check, Verdict
from theinference.curriculum.checks.floor import worth_measuring
from theinference.curriculum.checks.swap import PATIENCE, Seen, SwapPlan, departs
from theinference.curriculum.stages import Case, Stage
from theinference.diagnosis.errors import lesson_for
from theinference.grading.answers import Answers
from theinference.grading.measured import measured_call, measured_probe, refusal_call, room_beside
from theinference.grading.outcomes import verdict_for_must_raise, verdict_without_value
from theinference.grading.pending import PendingPlan
from theinference.results import CaseResult, Status, finding_of
from theinference.student.channel import NO_PROBE, Probe
from theinference.student.process import StudentProcess
from theinference.student.replies import Outcome

# an answer that departs over the swapped cache and, asked again, is right over its own
DEPARTS = (
    "with the cache's K/V swapped right after {hook} returned, the answer is neither the one "
    "over the swapped cache nor the one over the original, though over the original it is "
    "right: part of the cache read and part recomputed, the K/V kept twice and only one copy "
    "found, or a decode that began reading the cache before any function returned after the "
    "prefill (the swap waits for such a return: keep the prefill a function of its own)?"
)

# a departing answer not asked again: the stage's smaller cases, asked again, show its bug
UNASKED = (
    "with the cache's K/V swapped right after {hook} returned, the answer is neither the one "
    "over the swapped cache nor the one over the original (not asked again over your own "
    "cache: the stage's smaller failing cases were, and its diagnosis reads them)"
)


def grade_case(
    stage: Stage, case: Case, process: StudentProcess, answers: Answers,
    ask_again: Callable[[], bool] | bool = True, lift_limit: bool = True,
) -> tuple[CaseResult, list, Verdict]:
    """The case's result, complete (an error's lesson included), with the adapter's arguments
    and the judge's verdict (whose `actual` the stage's diagnosis reads). `ask_again` (or a
    function asked when an answer departs): an answer that departs over the swapped cache is
    asked again over the student's own cache only while the diagnosis wants failing answers.
    `lift_limit`: a measured call's CPU limit ends once its swap is sent (measured_call)."""
    check = CHECKS[case.check]
    args = check.arguments(case, answers.recompute.config)
    clock = OracleClock()
    measured = is_measured(check, case, args, answers.recompute.config)
    fixed = fix_answer(case, args, answers, clock, measured)
    if measured:
        outcome = measured_call(stage, check, args, process, answers,
                                measured_probe(check, fixed, lift_limit))
        fixed = resolved(fixed, clock)
    elif case.inputs.get("must_raise"):
        outcome = refusal_call(stage, case, args, process, answers)
    else:
        on_hook = fixed.answer if isinstance(fixed, SwapPlan | PendingPlan) else None
        probe = Probe(check.hook, check.watch, on_hook)
        outcome = process.call(check.adapter, args, stage.timeout, probe)
        fixed = resolved(fixed, clock)
    asked = Question(stage, case, args, answers, clock)
    verdict = judge(asked, outcome, fixed, measured=measured)
    if isinstance(fixed, SwapPlan) and departs(verdict):
        ask_again = ask_again() if callable(ask_again) else ask_again
        if ask_again and measured:  # the floor's evidence, as where no swap could be made
            outcome, verdict = floor_alone(asked, process, fixed)
        elif ask_again:
            outcome, verdict = asked_unswapped(asked, process, fixed)
        else:
            verdict.message = UNASKED.format(hook=stage.words["hook"])
    return case_result(case, outcome, verdict, clock), args, verdict


def resolved(fixed, clock: "OracleClock"):
    """The answer fixed before a call, a PendingPlan made by now (while the call ran: its
    oracle seconds on `clock` too)."""
    if not isinstance(fixed, PendingPlan):
        return fixed
    plan, seconds = fixed.resolve()
    clock.seconds += seconds
    return plan


def floor_alone(asked: "Question", process, plan: SwapPlan | None) -> tuple:
    """(outcome, verdict) of the case called again alone in a fresh process with no swap,
    the floor its evidence (a swap, where one was tried, spent: `plan` names it)."""
    check = CHECKS[asked.case.check]
    outcome = measured_call(asked.stage, check, asked.args, process, asked.answers, NO_PROBE)
    return outcome, judge(asked, outcome, plan, rerun=True, measured=True)


def case_result(case: Case, outcome: Outcome, verdict: Verdict, clock: "OracleClock"):
    """The case's result, complete: the verdict's finding, what the call printed and took,
    the oracle's time, and the lesson of an error."""
    result = CaseResult(
        **finding_of(verdict),
        name=case.name,
        traceback=outcome.traceback,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        student_seconds=outcome.seconds,
        oracle_seconds=clock.seconds,
        hidden=case.hidden,
    )
    if (lesson := lesson_for(result)) is not None:
        result.lesson = lesson[0].id
    return result


def kept_prompts(stage: Stage, config, drawn: bool = False) -> list[list[int]]:
    """The prompts of the stage's cases that swap a cache, longest first: the K/V the oracle
    keeps, of which each drawn prompt is a beginning (its spec draws a length alone). A prompt
    the run drew (a cache-use proof's) only where `drawn`: a run whose seed was given, so that
    every run given it draws the same prompt (a class graded with one seed); a fresh seed's
    are never drawn again, and are not kept."""
    prompts = [
        CHECKS[c.check].kept_prompt(CHECKS[c.check].arguments(c, config))
        for c in stage.cases
        if CHECKS[c.check].swap is not None and "draw" not in c.inputs
        and (drawn or "drawn" not in c.inputs)
    ]
    return sorted(prompts, key=len, reverse=True)


def swaps(check: Check, case: Case, measured: bool) -> bool:
    """Whether the case's call has its cache swapped: a check's that swaps, but a request that
    must be refused (it never reaches a cache); where the check has a floor, its measured cases
    alone (the floor's evidence, where the swap cannot be made: a small case is no evidence,
    and its swap would cost a recompute's every return a search)."""
    if check.swap is None or case.inputs.get("must_raise"):
        return False
    return check.flop is None or measured


def is_measured(check: Check, case: Case, args: list, config) -> bool:
    """Whether the call runs alone in a fresh process against the floor: a cost proof, or a
    graded case whose recompute needs many times a cache's work (floor.worth_measuring)."""
    if check.flop is None or case.inputs.get("must_raise"):
        return False
    cached = check.cached_flop(args, config) if check.cached_flop else None
    return worth_measuring(check.flop(args, config), cached)


def asked_unswapped(asked: "Question", process, plan: SwapPlan):
    """An answer that departs over the swapped cache, asked again over the student's own
    cache: there the stage's diagnosis can name the bug (a wrong position, a shared cache),
    and a right answer there says the decode reads part of its cache and recomputes part."""
    check, stage = CHECKS[asked.case.check], asked.stage
    outcome = process.call(check.adapter, asked.args, stage.timeout,
                           Probe(check.hook, check.watch))
    verdict = judge(asked, outcome, plan, rerun=True)
    if verdict.status == Status.PASSED and check.flop is not None:
        return outcome, verdict  # right over its own cache: the floor's cases prove cache use
    return outcome, departed(verdict, stage)


def departed(own: Verdict, stage: Stage) -> Verdict:
    """The verdict of an answer that departs over the swapped cache, from `own`, the one over
    the student's own cache: its bug there, said to depart over the swap too; right there, a
    decode that reads part of its cache and recomputes part (DEPARTS)."""
    if own.status == Status.PASSED:
        return Verdict(Status.FAILED, message=DEPARTS.format(hook=stage.words["hook"]))
    if own.status == Status.FAILED:
        own.message = f"{own.message} (over the swapped cache too)"
    return own


def fix_answer(case: Case, args: list, answers: Answers, clock: "OracleClock", measured: bool,
               unlimited: bool = False):
    """The answer the call will be judged against, before the call: a swap's plan (a measured
    call's, still being made: a PendingPlan, which the call does not wait for), the expected
    value of the call's own arguments, or None where it depends on the answer (or no swap
    could be drawn: its plan is None). `unlimited`: the call has no CPU limit, which the
    oracle's thread beside it could bring nearer (swap_first.py)."""
    check = CHECKS[case.check]
    if swaps(check, case, measured):
        seed = int(case.inputs.get("swap", 0))
        if begins_unplanned(check, args, answers, measured, unlimited) and answers.being_made(
            case.check, args, seed
        ):
            answers.want(case.check, args, seed)  # its call begins: its plan is made next
            patience = PATIENCE if measured else None  # a floor is the fallback: swap.py
            return PendingPlan(lambda: planned_or_made(check, args, seed, answers),
                               answers.recompute.config, check.swap_rows(args), patience)
        plan, seconds = planned_or_made(check, args, seed, answers)
        clock.seconds += seconds
        return plan
    if check.asks_own_arguments and not case.inputs.get("must_raise"):
        return clock.timed(answers.expected, case.check, args)
    return None


def planned_or_made(check: Check, args: list, seed: int, answers: Answers) -> tuple:
    """(the case's plan, the oracle's seconds): made ahead (ahead.py: beside, or between
    runs), else (none was, or the planner stopped before it: a weights error, a closed stage)
    made now."""
    made = answers.planned(check.name, args, seed)
    if made is not None:
        return made
    clock = OracleClock()
    plan = clock.timed(check.swap, answers.recompute, args, seed, answers.prompt_state)
    return plan, clock.seconds


def begins_unplanned(check: Check, args: list, answers: Answers, measured: bool,
                     unlimited: bool) -> bool:
    """Whether a swapped call may begin while its plan is still made (pending.py): a swap
    after the prefill (its sizes fixed by the arguments: Check.swap_rows), on a call with no
    CPU limit, or a measured one whose floor has room for the oracle beside it."""
    if check.swap_rows is None:
        return False
    return not measured or unlimited or room_beside(check, args, answers)


class OracleClock:
    """Seconds spent asking the oracle for one case."""

    def __init__(self):
        self.seconds = 0.0

    def timed(self, ask, *args):
        started = time.monotonic()
        try:
            return ask(*args)
        finally:
            self.seconds += time.monotonic() - started


@dataclass(frozen=True)
class Question:
    """One case as asked: its stage, the case, the adapter's arguments, the oracle's answers
    and the clock their time is charged to."""

    stage: Stage
    case: Case
    args: list
    answers: Answers
    clock: OracleClock


def judge(
    asked: Question, outcome: Outcome, fixed=None, rerun: bool = False, measured: bool = False
) -> Verdict:
    stage, case, args, answers, clock = (asked.stage, asked.case, asked.args, asked.answers,
                                         asked.clock)
    check = CHECKS[case.check]
    if case.inputs.get("must_raise"):
        return verdict_for_must_raise(outcome, case)
    if outcome.kind != "returned":
        return verdict_without_value(outcome)
    value = outcome.value
    seen = Seen(fixed, outcome.probe, rerun) if isinstance(fixed, SwapPlan) else None
    if check.flop is not None:  # what was measured, where the call was; the swap, where made
        value = (outcome.value, outcome.measured if measured else None, seen)
    elif seen is not None:
        value = (outcome.value, seen)

    def ask(question: list):
        if isinstance(fixed, SwapPlan) and question == args:
            return fixed.plain()
        if fixed is not None and question == args:
            return fixed
        return clock.timed(answers.expected, case.check, question)

    verdict = check.judge(value, args, ask, stage.tolerance, answers.recompute.config)
    over_own_cache = seen is None or not seen.applied
    if check.simulate is not None and over_own_cache and verdict.comparisons:
        noise = clock.timed(answers.noise, case.check, args)
        verdict.comparisons = [replace(c, noise=noise) for c in verdict.comparisons]
    return verdict
