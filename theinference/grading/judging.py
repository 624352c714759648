"""One case: ask the student's process, then judge what came back against the oracle's answers.

The oracle runs after the student's call, not beside it: both use every core through BLAS, and
overlapping them on a small machine made each several times slower. It also runs only when
there is something to compare (a todo or an error costs no oracle time).
"""

import time
from dataclasses import replace

from theinference.curriculum.checks import CHECKS, Verdict
from theinference.curriculum.checks.cost import call_against_baseline, is_baseline_probe
from theinference.curriculum.stages import Case, Stage
from theinference.diagnosis.errors import lesson_for
from theinference.grading.answers import Answers
from theinference.results import CaseResult, Status, finding_of
from theinference.student.process import StudentProcess
from theinference.student.replies import Outcome

OUTCOME_STATUS = {
    "todo": Status.TODO,
    "timeout": Status.TIMEOUT,
}
# the workers' prefill watch (it counts prefill's calls; the cache it zeroes is not read here)
REFUSAL_PROBE = {"kind": "zero_cache_after_prefill"}


def grade_case(
    stage: Stage, case: Case, process: StudentProcess, answers: Answers
) -> tuple[CaseResult, list, Verdict]:
    """The case's result, complete (an error's lesson included), with the adapter's arguments
    and the judge's verdict (whose `actual` the stage's diagnosis reads)."""
    check = CHECKS[case.check]
    args = check.arguments(case, answers.recompute.config)
    probe = check.probe(args) if check.probe else None
    if case.inputs.get("must_raise"):
        probe = REFUSAL_PROBE  # did the work start before the refusal?
    if is_baseline_probe(probe):
        outcome = call_against_baseline(process, check.adapter, args, stage.timeout, probe)
    else:
        outcome = process.call(check.adapter, args, stage.timeout, probe)
    clock = OracleClock()
    verdict = judge(stage, case, args, outcome, answers, clock)
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
    stage: Stage, case: Case, args: list, outcome: Outcome, answers: Answers, clock: OracleClock
) -> Verdict:
    check = CHECKS[case.check]
    if case.inputs.get("must_raise"):
        return verdict_for_must_raise(outcome, case)
    if outcome.kind != "returned":
        return verdict_without_value(outcome)
    value = (outcome.value, outcome.probe) if check.probe else outcome.value

    def ask(question: list):
        return clock.timed(answers.expected, case.check, question)

    verdict = check.judge(value, args, ask, stage.tolerance, answers.recompute.config)
    if check.simulate is not None and verdict.comparisons:
        noise = clock.timed(answers.noise, case.check, args)
        verdict.comparisons = [replace(c, noise=noise) for c in verdict.comparisons]
    return verdict


def verdict_for_must_raise(outcome: Outcome, case: Case) -> Verdict:
    """A case whose request is invalid (e.g. generating past the context): the student's code
    must refuse it with the exception the template names, up front: before prefill runs, not
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
    """The right exception: passed when prefill never ran before it."""
    calls = (outcome.probe or {}).get("prefill_calls")
    if calls == 0:
        return Verdict(Status.PASSED, message=f"raised {outcome.message} before any work, as it "
                       "should")
    if calls is None:
        why = (outcome.probe or {}).get("reason") or "the probe did not run"
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
