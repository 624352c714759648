"""A measured call: alone in a fresh process whose every CPU-second is accounted, stopped at a
fraction of the floor (checks/floor.py), the machine's rate measured just before it. A cost
proof's, a refusal's, and a graded case's whose recompute needs many times a cache's work
(judging.is_measured), where the floor is the evidence (swap_first.py: where a swap is, it is
tried first, beside the other cases, and the floor judges only where it proves nothing).
"""

from dataclasses import replace

from theinference.curriculum.checks import CHECKS, Check
from theinference.curriculum.checks.floor import budget, forward_flop
from theinference.curriculum.checks.swap import SwapPlan
from theinference.curriculum.stages import Case, Stage
from theinference.grading.answers import Answers
from theinference.grading.pending import PendingPlan
from theinference.student.calibration import rate_now
from theinference.student.channel import NO_PROBE, Probe
from theinference.student.replies import Outcome

UNACCOUNTED = ("unaccounted", "started_process")  # a measured call that cannot be trusted
REFUSAL_FRACTION = 0.5  # of one forward's floor over the prompt, when the spec names none


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

