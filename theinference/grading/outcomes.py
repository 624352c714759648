"""The verdicts an outcome gives by itself, with no answer to compare: a call that gave none
(todo, a timeout, an error), and a request that must be refused up front, judged by what its
refusal cost (measured.refusal_call measures it)."""

from theinference.curriculum.checks import Verdict
from theinference.curriculum.checks.floor import CANNOT_MEASURE
from theinference.curriculum.stages import Case
from theinference.results import Status
from theinference.student.replies import Outcome

OUTCOME_STATUS = {
    "todo": Status.TODO,
    "timeout": Status.TIMEOUT,
    "cpu_limit": Status.FAILED,  # a CPU budget is a cost check's: past it, the cost failed
}


def verdict_for_must_raise(outcome: Outcome, case: Case) -> Verdict:
    """A case whose request is invalid (e.g. generating past the context): the student's code
    must refuse it with the exception the template names, up front: at almost no cost, not
    from a guard met once the work has begun nor by crashing into it."""
    wanted = case.inputs.get("raises", "ValueError")
    request = case.inputs["must_raise"]
    measured = outcome.measured or {}
    if measured.get("failure"):
        return Verdict(Status.FAILED, message=f"{request}: {measured['failure']}")
    if measured.get("stopped"):
        return Verdict(Status.FAILED, message=refused_too_late(request, None, measured, wanted))
    if outcome.kind == "raised" and outcome.exception == wanted:
        return refusal_verdict(outcome, request, wanted)
    if outcome.kind == "raised":
        return Verdict(
            Status.FAILED,
            message=f"{request}: it raised {outcome.message} instead of "
            f"{wanted}. Check the request up front and raise {wanted}.",
        )
    if outcome.kind == "returned" and "error" in measured:
        return Verdict(Status.FAILED, message=CANNOT_MEASURE.format(why=measured["error"]))
    if outcome.kind == "returned":
        return Verdict(Status.FAILED, message=f"{request}: it returned")
    return verdict_without_value(outcome)


def refusal_verdict(outcome: Outcome, request: str, wanted: str) -> Verdict:
    """The right exception: passed when it cost well under the work a refusal must come before
    (the CPU time of the call, measured from outside against one forward's floor)."""
    measured = outcome.measured or {}
    seconds, floor, limit = (measured.get(k) for k in ("cpu_seconds", "floor", "limit"))
    if not all(isinstance(x, float) for x in (seconds, floor, limit)):
        why = measured.get("error") or "no CPU time was measured"
        return Verdict(Status.FAILED, message=CANNOT_MEASURE.format(why=why))
    if seconds > limit:
        return Verdict(Status.FAILED, message=refused_too_late(request, outcome, measured, wanted))
    return Verdict(
        Status.PASSED,
        message=f"raised {outcome.message} up front, as it should: {seconds:.2f} s of CPU, "
        f"where one forward over the prompt needs {floor:.2f} s on this machine",
    )


def refused_too_late(request: str, outcome: Outcome | None, measured: dict, wanted: str) -> str:
    """A refusal (or none) after the work had begun: what it cost against one forward."""
    floor, limit = measured.get("floor", 0.0), measured.get("limit", 0.0)
    said = (
        f"it raised {outcome.message} only after {measured.get('cpu_seconds', 0.0):.2f} s of CPU"
        if outcome is not None
        else f"it had not refused after {limit:.2f} s of CPU (it was stopped there)"
    )
    return (
        f"{request}: {said}, over {limit / max(floor, 1e-9):.0%} of the {floor:.2f} s one "
        f"forward over the prompt needs on this machine: the work had begun. Check the request "
        f"up front and raise {wanted} before any work: a guard met later refuses too late."
    )


def verdict_without_value(outcome: Outcome) -> Verdict:
    """todo, timeout, or an error: the call gave nothing to compare."""
    status = OUTCOME_STATUS.get(outcome.kind, Status.ERROR)
    return Verdict(status, message=outcome.message)
