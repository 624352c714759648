"""A measured case whose cache is swapped, tried first beside the stage's other cases.

A case the floor judges (judging.is_measured) runs alone in a fresh process (measured.py), so
that its CPU time and the machine's rate are its own. Where the case also swaps its cache
(generate-loop's long generations and its cost proof, prefix-caching's cost proof), the swap
is evidence wherever the call runs: an answer over K/V that no token sequence has comes only
from reading the cache, in a fresh process or in one that served other cases, however long it
took. So such a case is first called as an unmeasured one is, beside the other cases, with its
swap, and a CPU budget only until the swap is sent (`try_beside`, `try_limit`). Its verdict
stands where the answer followed the swapped cache, or failed by what it returned. Where only
the floor can judge (no swap was made and the answer is right, or the answer departs from both
caches and the diagnosis asks again), or the call ran out of time or budget before its swap
was sent, the case is `Deferred`: called again alone, measured, once the cases beside it are
done (`measure_alone`), as every measured case was before (with its swap where its search was
finding the cache: `floor_only`), on a prompt drawn for the run where its try's prompt is
fixed (stages.for_floor: the fixed prompt's K/V are kept across runs, so the try costs the
oracle a few decodes; its answers could be made ahead by code that knows the spec).
"""

from collections.abc import Callable
from dataclasses import dataclass

from theinference.curriculum.checks import CHECKS, Verdict
from theinference.curriculum.checks.floor import cost_beside, forward_flop
from theinference.curriculum.checks.swap import Seen, SwapPlan, departs
from theinference.curriculum.stages import Case, Stage, for_floor
from theinference.grading.answers import Answers
from theinference.grading.environment import blas_is_one_thread
from theinference.grading.judging import (
    UNASKED,
    OracleClock,
    Question,
    case_result,
    fix_answer,
    floor_alone,
    grade_case,
    is_measured,
    judge,
    resolved,
)
from theinference.grading.measured import measured_probe
from theinference.results import Status
from theinference.student.calibration import BOUNDS_FOR, rate_soon
from theinference.student.process import StudentProcess
from theinference.student.replies import Outcome


@dataclass
class Deferred:
    """A case the floor must judge, called alone and measured after the cases beside it.
    `floor_only`: its swap spent beside (or none could be drawn: `plan` None), the floor
    alone judges it; else it is measured as grade_case measures, its swap first. `plan`: its
    swap's plan as the call beside had it."""

    case: Case
    floor_only: bool
    plan: SwapPlan | None = None
    oracle_seconds: float = 0.0


def tries_beside(case: Case, config) -> bool:
    """Whether the case is tried beside the others first: measured, and its cache swapped."""
    check = CHECKS[case.check]
    if case.inputs.get("must_raise") or check.swap is None:
        return False
    return is_measured(check, case, check.arguments(case, config), config)


def try_beside(stage: Stage, case: Case, process: StudentProcess, answers: Answers,
               ask_again: Callable[[], bool]) -> tuple | Deferred:
    """grade_case's (result, arguments, verdict) from a call in `process` with the case's swap
    (its CPU budgeted until the swap is sent: try_limit), where that settles the case; else
    the case Deferred."""
    check = CHECKS[case.check]
    args = check.arguments(case, answers.recompute.config)
    clock = OracleClock()
    fixed = fix_answer(case, args, answers, clock, measured=True, unlimited=True)
    if fixed is None:  # no swap could be drawn: only the floor can judge
        return Deferred(case, floor_only=True, oracle_seconds=clock.seconds)
    config = answers.recompute.config
    # within BOUNDS_FOR (it decides no verdict), or measured beside the call's start (its
    # budget none till then)
    rate = rate_soon(process, in_thread=blas_is_one_thread(), fresh_for=BOUNDS_FOR)
    limit = lambda: try_limit(stage, check, args, config, rate.known())  # noqa: E731
    outcome = process.call(check.adapter, args, stage.timeout,
                           measured_probe(check, fixed, lift_limit=True), cpu_limit=limit)
    fixed = resolved(fixed, clock)
    verdict = judge(Question(stage, case, args, answers, clock), outcome, fixed)
    if needs_floor(verdict, outcome, fixed, ask_again):
        return Deferred(case, floor_only=floor_only(outcome, fixed), plan=fixed,
                        oracle_seconds=clock.seconds)
    if departs(verdict):  # not asked again: the stage's smaller failing cases were
        verdict.message = UNASKED.format(hook=stage.words["hook"])
    elif verdict.status == Status.PASSED:  # over the swap: what it cost, said beside (a
        # figure only, as a measured call's pass says it)
        measured = rate.wait()
        floor = check.flop(args, config) / measured if measured else None
        cost = cost_beside({"cpu_seconds": outcome.cpu_seconds, "floor": floor})
        verdict.message = f"{verdict.message} ({cost})"
    return case_result(case, outcome, verdict, clock), args, verdict


# the try's CPU budget until its swap is sent, in forwards over the swapped prompt: a prefill
# costs about one (the reference's, in a fresh process: 1.3 to 2.5x its arithmetic, page faults
# included), so slow correct code has room; past it, the case is measured alone, where the swap
# still lifts the limit, and a recompute whose cache is not found pays this much more, not the
# whole recompute the try would otherwise run
TRY_PREFILLS = 8


def try_limit(stage: Stage, check, args: list, config, rate: float | None) -> float | None:
    """The CPU seconds the try may use before its swap is sent (then lifted): TRY_PREFILLS
    forwards over the prompt at `rate`, at most the floor's own limit. Never a verdict: a try
    stopped there is measured alone. None where no rate is had (yet: the call begins before its
    rate is measured, its CPU counted from its start all the same)."""
    if rate is None:
        return None
    prefills = TRY_PREFILLS * forward_flop(config, check.swap_rows(args))
    floor_limit = check.flop(args, config) * float(stage.words["floor_fraction"])
    return min(prefills, floor_limit) / rate


def needs_floor(verdict: Verdict, outcome: Outcome, plan, ask_again: Callable[[], bool]) -> bool:
    """Whether only the floor can judge a call made beside: it ran out of time, or out of the
    try's CPU before its swap was sent (alone, the floor's limit stops it, with its verdict),
    or its right answer rests on no swap, or its answer departs from both caches and the
    diagnosis asks again (where the floor's measure tells a partial recompute from a bug, as
    measured calls always did)."""
    if outcome.kind in ("timeout", "cpu_limit"):
        return True
    if verdict.status == Status.PASSED:
        return not (isinstance(plan, SwapPlan) and Seen(plan, outcome.probe).applied)
    return departs(verdict) and ask_again()


def floor_only(outcome: Outcome, plan) -> bool:
    """Whether a deferred try is judged by the floor alone. Not where it ran out of time or
    budget while its search was finding the cache, before the swap was sent: alone, the swap
    is tried again under the floor's limit (a correct cache slower than the floor allows
    passes by it there). A cache the search never saw meets the floor with no search to pay
    for."""
    seen = isinstance(plan, SwapPlan) and plan.most > 0
    return not (seen and outcome.kind in ("timeout", "cpu_limit"))


def measure_alone(deferred: Deferred, stage: Stage, process: StudentProcess, answers: Answers,
                  ask_again: Callable[[], bool], lift_limit: bool) -> tuple:
    """grade_case's (result, arguments, verdict) of a deferred case, measured alone in a
    fresh process, on its floor's inputs where it has them (stages.for_floor): with no swap
    where the floor alone judges (as a departing answer asked again is); else as grade_case
    grades a measured case."""
    case = for_floor(deferred.case)  # a fixed prompt's proof meets the floor on a fresh one
    if not deferred.floor_only:
        return grade_case(stage, case, process, answers, ask_again, lift_limit)
    args = CHECKS[case.check].arguments(case, answers.recompute.config)
    clock = OracleClock()
    clock.seconds = deferred.oracle_seconds
    plan = deferred.plan if case is deferred.case else None  # the try's, for its arguments
    outcome, verdict = floor_alone(Question(stage, case, args, answers, clock), process, plan)
    return case_result(case, outcome, verdict, clock), args, verdict
