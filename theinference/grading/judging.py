"""One case: ask the student's process, then judge what came back against the oracle's answers.

The oracle runs before or after the student's call, never beside it: both use every core
through BLAS, and overlapping them on a small machine made each several times slower. Where
the question is the call's own arguments, its answer is fixed before the call starts, so
nothing the call does can change what it is judged against; generate-loop asks along the
student's own tokens, after the call, from answers held where the student cannot write.
"""

import time
from dataclasses import replace

from theinference.curriculum.checks import CHECKS, Check, Verdict
from theinference.curriculum.checks.common import Words
from theinference.curriculum.checks.floor import budget, worth_measuring
from theinference.curriculum.checks.swap import DEPARTS, Seen, SwapPlan, departs
from theinference.curriculum.stages import Case, Stage
from theinference.diagnosis.errors import lesson_for
from theinference.grading.answers import Answers
from theinference.results import CaseResult, Status, finding_of
from theinference.student.calibration import sgemm_rate
from theinference.student.process import StudentProcess
from theinference.student.replies import Outcome

OUTCOME_STATUS = {
    "todo": Status.TODO,
    "timeout": Status.TIMEOUT,
    "cpu_limit": Status.FAILED,  # a CPU budget is a cost check's: past it, the cost failed
}
REFUSAL_HOOK = "prefill"  # a refusal's witness: did prefill begin before it?


def grade_case(
    stage: Stage, case: Case, process: StudentProcess, answers: Answers
) -> tuple[CaseResult, list, Verdict]:
    """The case's result, complete (an error's lesson included), with the adapter's arguments
    and the judge's verdict (whose `actual` the stage's diagnosis reads)."""
    check = CHECKS[case.check]
    args = check.arguments(case, answers.recompute.config)
    clock = OracleClock()
    fixed = fix_answer(check, case, args, answers, clock)
    measured = is_measured(check, case, args, answers.recompute.config)
    if measured:
        outcome = measured_call(stage, check, args, process, answers)
    else:
        on_hook = fixed.answer if isinstance(fixed, SwapPlan) else None
        hook = REFUSAL_HOOK if case.inputs.get("must_raise") else check.hook
        outcome = process.call(check.adapter, args, stage.timeout, hook, on_hook, watch=check.watch)
    verdict = judge(stage, case, args, outcome, answers, clock, fixed, measured=measured)
    if isinstance(fixed, SwapPlan) and departs(verdict):
        outcome, verdict = asked_unswapped(stage, case, args, process, answers, clock, fixed)
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


def is_measured(check: Check, case: Case, args: list, config) -> bool:
    """Whether the call runs alone in a fresh process against the floor: a cost proof, or a
    graded case whose recompute needs many times a cache's work (floor.worth_measuring)."""
    if check.flop is None or case.inputs.get("must_raise"):
        return False
    cached = check.cached_flop(args, config) if check.cached_flop else None
    return worth_measuring(check.flop(args, config), cached)


def asked_unswapped(stage, case, args, process, answers, clock, plan: SwapPlan):
    """An answer that departs over the swapped cache, asked again over the student's own
    cache: there the stage's diagnosis can name the bug (a wrong position, a shared cache),
    and a right answer there says the decode reads part of its cache and recomputes part."""
    check = CHECKS[case.check]
    outcome = process.call(check.adapter, args, stage.timeout, check.hook, watch=check.watch)
    verdict = judge(stage, case, args, outcome, answers, clock, plan, rerun=True)
    if verdict.status == Status.PASSED:
        hook = Words(f"theinference.curriculum.checks.{stage.slug.replace('-', '_')}")("hook")
        verdict = Verdict(Status.FAILED, message=DEPARTS.format(hook=hook))
    elif verdict.status == Status.FAILED:
        verdict.message = f"{verdict.message} (over the swapped cache too)"
    return outcome, verdict


def fix_answer(check: Check, case: Case, args: list, answers: Answers, clock: "OracleClock"):
    """The answer the call will be judged against, before the call: a swap's plan, the
    expected value of the call's own arguments, or None where it depends on the answer."""
    if check.swap is not None:
        seed = int(case.inputs.get("swap", 0))
        return clock.timed(check.swap, answers.recompute, args, seed)
    if check.asks_own_arguments and not case.inputs.get("must_raise"):
        return clock.timed(answers.expected, case.check, args)
    return None


def measured_call(stage: Stage, check: Check, args: list, process, answers: Answers) -> Outcome:
    """The call alone in a fresh process, stopped at the stage's fraction of the floor: the
    CPU time a recompute's arithmetic needs at this machine's rate (checks/floor.py)."""
    rate, why = sgemm_rate(process)
    if rate is None:
        outcome = Outcome("returned")
        outcome.probe = {"error": why}
        return outcome
    flop = check.flop(args, answers.recompute.config)
    floor, limit = budget(flop, rate, float(stage.words["floor_fraction"]))
    process.stop()  # a fresh process: nothing from an earlier call is at hand
    outcome = process.call(check.adapter, args, stage.timeout, cpu_limit=limit)
    process.stop()
    measured = {"cpu_seconds": outcome.cpu_seconds, "floor": floor, "limit": limit}
    outcome.probe = measured | {"rate": rate, "stopped": outcome.kind == "cpu_limit"}
    if outcome.kind == "cpu_limit":
        outcome.kind = "returned"  # judged: a call stopped at the limit recomputes
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


def judge(
    stage: Stage,
    case: Case,
    args: list,
    outcome: Outcome,
    answers: Answers,
    clock: OracleClock,
    fixed=None,
    rerun: bool = False,
    measured: bool = False,
) -> Verdict:
    check = CHECKS[case.check]
    if case.inputs.get("must_raise"):
        return verdict_for_must_raise(outcome, case)
    if outcome.kind != "returned":
        return verdict_without_value(outcome)
    value = outcome.value
    seen = Seen(fixed, outcome.probe, rerun) if isinstance(fixed, SwapPlan) else None
    if seen is not None:
        value = (outcome.value, seen)
    elif check.flop is not None:  # what was measured, where the call was
        value = (outcome.value, outcome.probe if measured else None)

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


def verdict_for_must_raise(outcome: Outcome, case: Case) -> Verdict:
    """A case whose request is invalid (e.g. generating past the context): the student's code
    must refuse it with the exception the template names, up front: before prefill begins, not
    from a guard met later (after all that work) nor by crashing into it."""
    wanted = case.inputs.get("raises", "ValueError")
    if outcome.kind == "raised" and outcome.exception == wanted:
        return refusal_verdict(outcome, case.inputs["must_raise"], wanted)
    if outcome.kind == "raised":
        return Verdict(
            Status.FAILED,
            message=f"{case.inputs['must_raise']}: it raised {outcome.message} instead of "
            f"{wanted}. Check the request up front and raise {wanted}.",
        )
    if outcome.kind == "returned":
        return Verdict(Status.FAILED, message=f"{case.inputs['must_raise']}: it returned")
    return verdict_without_value(outcome)


def refusal_verdict(outcome: Outcome, request: str, wanted: str) -> Verdict:
    """The right exception: passed when prefill never began before it."""
    hook = outcome.probe or {}
    began = hook.get("entered") if hook.get("found") else None
    if began == 0:
        return Verdict(Status.PASSED, message=f"raised {outcome.message} before any work, as it "
                       "should")
    if began is None:
        why = "no function named prefill in src/kvcache.py" if hook else "the hook did not run"
        return Verdict(
            Status.FAILED,
            message=f"{request}: it raised {outcome.message}, but whether it did so before any "
            f"work cannot be told ({why}). Check the request up front, before prefill.",
        )
    return Verdict(
        Status.FAILED,
        message=f"{request}: it raised {outcome.message} only after prefill had run. Check the "
        f"request up front and raise {wanted} before any work: a guard met later in the decode "
        "refuses too late.",
    )


def verdict_without_value(outcome: Outcome) -> Verdict:
    """todo, timeout, or an error: the call gave nothing to compare."""
    status = OUTCOME_STATUS.get(outcome.kind, Status.ERROR)
    return Verdict(status, message=outcome.message)
