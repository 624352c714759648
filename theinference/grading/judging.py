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
from theinference.curriculum.checks.floor import budget, forward_flop, worth_measuring
from theinference.curriculum.checks.swap import Seen, SwapPlan, departs
from theinference.curriculum.stages import Case, Stage
from theinference.diagnosis.errors import lesson_for
from theinference.grading.answers import Answers
from theinference.grading.outcomes import verdict_for_must_raise, verdict_without_value
from theinference.grading.pending import PendingPlan
from theinference.results import CaseResult, Status, finding_of
from theinference.student.calibration import rate_now
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

UNACCOUNTED = ("unaccounted", "started_process")  # a measured call that cannot be trusted
REFUSAL_FRACTION = 0.5  # of one forward's floor over the prompt, when the spec names none


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
    fixed = fix_answer(check, case, args, answers, clock, measured)
    if measured:
        outcome = measured_call(stage, check, args, process, answers,
                                measured_probe(check, fixed, lift_limit))
        if isinstance(fixed, PendingPlan):  # made while the call ran: the oracle's time too
            fixed, seconds = fixed.resolve()
            clock.seconds += seconds
    elif case.inputs.get("must_raise"):
        outcome = refusal_call(stage, case, args, process, answers)
    else:
        on_hook = fixed.answer if isinstance(fixed, SwapPlan) else None
        probe = Probe(check.hook, check.watch, on_hook)
        outcome = process.call(check.adapter, args, stage.timeout, probe)
    asked = Question(stage, case, args, answers, clock)
    verdict = judge(asked, outcome, fixed, measured=measured)
    if isinstance(fixed, SwapPlan) and departs(verdict):
        ask_again = ask_again() if callable(ask_again) else ask_again
        if ask_again and measured:  # the floor's evidence, as where no swap could be made
            outcome = measured_call(stage, check, args, process, answers, NO_PROBE)
            verdict = judge(asked, outcome, fixed, rerun=True, measured=True)
        elif ask_again:
            outcome, verdict = asked_unswapped(asked, process, fixed)
        else:
            verdict.message = UNASKED.format(hook=stage.words["hook"])
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
    return result, args, verdict


def kept_prompts(stage: Stage, config) -> list[list[int]]:
    """The prompts of the stage's fixed cases that swap a cache, longest first: the K/V the
    oracle keeps, of which each drawn prompt is a beginning (its spec draws a length alone)."""
    prompts = [
        CHECKS[c.check].arguments(c, config)[0]
        for c in stage.cases
        if CHECKS[c.check].swap is not None and "draw" not in c.inputs and "drawn" not in c.inputs
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
    if verdict.status == Status.PASSED:
        verdict = Verdict(Status.FAILED, message=DEPARTS.format(hook=stage.words["hook"]))
    elif verdict.status == Status.FAILED:
        verdict.message = f"{verdict.message} (over the swapped cache too)"
    return outcome, verdict


def fix_answer(check: Check, case: Case, args: list, answers: Answers, clock: "OracleClock",
               measured: bool):
    """The answer the call will be judged against, before the call: a swap's plan (a measured
    call's, still being made: a PendingPlan, which the call does not wait for), the expected
    value of the call's own arguments, or None where it depends on the answer (or no swap
    could be drawn: its plan is None)."""
    if swaps(check, case, measured):
        seed = int(case.inputs.get("swap", 0))
        if measured and room_beside(check, args, answers) and answers.being_made(
                case.check, args, seed):
            wait = lambda: answers.planned(case.check, args, seed)  # noqa: E731
            return PendingPlan(wait, answers.recompute.config, check.swap_rows(args))
        made = answers.planned(case.check, args, seed)  # ahead.py: beside, or between runs
        if made is not None:
            clock.seconds += made[1]
            return made[0]
        return clock.timed(check.swap, answers.recompute, args, seed, answers.prompt_state)
    if check.asks_own_arguments and not case.inputs.get("must_raise"):
        return clock.timed(answers.expected, case.check, args)
    return None


ROOM = 16  # prefills of the prompt a recompute's arithmetic holds, at least, to meet a plan


def room_beside(check: Check, args: list, answers: Answers) -> bool:
    """Whether a measured call may begin while its plan is made (pending.py): the oracle's
    forward may slow the student's prefill a little, so only where the floor's limit holds
    many prefills (a 960-token prompt and 64 tokens: 66; the tests' 240 and 8: 8)."""
    if check.swap_rows is None:
        return False
    config = answers.recompute.config
    return check.flop(args, config) >= ROOM * forward_flop(config, check.swap_rows(args))


def measured_probe(check: Check, plan, lift_limit: bool) -> Probe:
    """A measured call's probe: with a swap `plan`, its cache is swapped after the prefill,
    and once the grader has sent the swap the CPU limit is lifted: the answer over the swapped
    cache is then the evidence, whatever the cost (unless `lift_limit` is off: an earlier case
    showed a decode that ignores the swap, which would recompute here to the end)."""
    if not isinstance(plan, SwapPlan | PendingPlan):
        return NO_PROBE
    swapped = (lambda: plan.sent) if lift_limit else None
    return Probe(check.hook, check.watch, plan.answer, swapped=swapped)


def measured_call(stage: Stage, check: Check, args: list, process, answers: Answers,
                  probe: Probe) -> Outcome:
    """The call alone in a fresh process whose every CPU-second is accounted, stopped at the
    stage's fraction of the floor: the CPU time a recompute's arithmetic needs at this
    machine's rate, measured just before it (checks/floor.py); `probe`: measured_probe's."""
    flop = check.flop(args, answers.recompute.config)
    call = (check.adapter, args, None)
    outcome = cpu_bounded_call(call, stage, process, flop, "floor_fraction", probe)
    if outcome.kind == "cpu_limit":
        outcome.kind = "returned"  # judged: a call stopped at the limit recomputes
    return outcome


def refusal_call(stage: Stage, case: Case, args: list, process, answers: Answers) -> Outcome:
    """A request that must be refused up front, judged by what it cost: alone in a fresh
    process, stopped at a fraction of one forward's floor over its prompt (a guard met once
    the work has begun costs about that much at least; a refusal up front, almost nothing).
    The case's `warm_up` request, a small valid one, goes first, unmeasured: an adapter that
    loads its model on its first call has not begun the request by loading it."""
    check, config = CHECKS[case.check], answers.recompute.config
    warm = case.inputs.get("warm_up")
    warm_args = check.arguments(replace(case, inputs=warm), config) if warm else None
    flop = forward_flop(config, len(args[0]))
    return cpu_bounded_call((check.adapter, args, warm_args), stage, process, flop,
                            "refusal_fraction")


def cpu_bounded_call(call: tuple, stage: Stage, process, flop: float, fraction: str,
                     probe: Probe = NO_PROBE):
    """The call alone (StudentProcess.call_alone) under `flop` at this machine's rate times the
    stage's `fraction`; its `measured` holds what was measured, or why nothing could be (an
    `error`), or why the call fails whatever it returned (a `failure`)."""
    rate, why = rate_now(process)  # beside the call, under the load it will meet
    if rate is None:
        outcome = Outcome("returned")
        outcome.measured = {"error": why}
        return outcome
    share = float(stage.words.get(fraction, REFUSAL_FRACTION))
    floor, limit = budget(flop, rate, share)
    adapter, args, warm_args = call  # the adapter, its arguments, a warm-up's (or None)
    outcome = process.call_alone(adapter, args, stage.timeout, limit, warm_args, probe)
    if outcome.kind in UNACCOUNTED:
        failure = outcome.message
        outcome = Outcome("returned")
        outcome.measured = {"failure": failure}
        return outcome
    measured = {"cpu_seconds": outcome.cpu_seconds, "floor": floor, "limit": limit}
    outcome.measured = measured | {"rate": rate, "stopped": outcome.kind == "cpu_limit"}
    return outcome


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
