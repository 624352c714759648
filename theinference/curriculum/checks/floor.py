"""A bound from arithmetic: a recompute cannot run faster than its floating-point operations at
this machine's matrix-product rate.

The rate is measured by the grader's own code (a fixed float32 matrix product in a fresh
process started like the student's, in the same sandbox and limits, that never loads the
student's code: student/calibration.py), as floating-point operations per CPU-second, just
before each measured call: a machine whose rate moves (other work on its host) moves both
alike. The call's CPU time is read from its CPU account (student/account.py), which counts
every process the call starts, or forbids it to start one; its kernel time is charged only
past a share of the limit (student/cpu.py's KERNEL_SHARE: page faults are not arithmetic). The
work a recompute of the measured call needs is counted from below: the projections and MLP
products of every row of every forward it must run, no attention, no layer norms, no unembed,
and the last layer only for the keys and values of the rows before the last. floor = work /
rate. A cache does a small part of that work; the call must cost under a fraction of the floor
(the stage's `floor_fraction`), and is stopped there. The call runs in a fresh process whose
arguments no other call has seen, so nothing can be remembered from elsewhere.
"""

from theinference.curriculum.checks.common import Verdict, Words
from theinference.oracle.config import ModelConfig
from theinference.results import Status


def forward_flop(config: ModelConfig, rows: int) -> float:
    """The least float32 work of one forward over `rows` positions that yields the last one's
    logits: every layer but the last for every row (the QKV, output, and two MLP products:
    12 d^2 multiply-adds a row), the last layer's K and V for every row (2 d^2)."""
    d, layers = config.n_embd, config.n_layer
    return 2.0 * rows * ((layers - 1) * 12 + 2) * d * d


# a graded case is measured against the floor when a recompute of it needs at least this
# much work, and this many times a cache's: then a correct cache, even at a quarter of the
# grader's rate, stays well under any fraction of the floor a stage sets
MEASURED_FLOP = 50e9  # about 3 s of float32 products on a laptop core
MEASURED_RATIO = 8.0
# a row decoded alone (matrix-vector products, a step's overhead and its unembedding) costs
# about this many rows of a prefill's matrix products: 10-16 measured here, doubled for slower
# correct code (float64, a Python loop over the cache)
DECODED_ROW = 32.0


def worth_measuring(flop: float, cached_flop: float | None) -> bool:
    """Whether a case's cost can tell a cache from a recompute (always, for a cost proof)."""
    if cached_flop is None:
        return True
    return flop >= MEASURED_FLOP and flop >= MEASURED_RATIO * max(cached_flop, 1.0)


def budget(flop: float, rate: float, fraction: float) -> tuple[float, float]:
    """(the floor, the CPU seconds the call may use) for `flop` at `rate` FLOP per CPU-second."""
    floor = flop / rate
    return floor, floor * fraction


CANNOT_MEASURE = (
    "the grader could not measure the CPU time of the call ({why}), and a check that cannot "
    "apply does not pass"
)


def floor_verdict(
    measured: dict | None, say: Words, figures: dict, bug: str | None = "decode-recomputes"
) -> Verdict | str:
    """What was measured, when the call cost well under the floor; else a failing verdict that
    says so. Never a pass when nothing could be measured."""
    measured = measured or {}
    if measured.get("failure"):  # the call started a process, or no account could be had
        return Verdict(Status.FAILED, message=measured["failure"], suspected_bug=bug)
    seconds, floor, limit = (measured.get(k) for k in ("cpu_seconds", "floor", "limit"))
    if measured.get("stopped") and isinstance(limit, float):
        seconds = seconds if isinstance(seconds, float) else limit
    if not all(isinstance(x, float) for x in (floor, limit)) or not isinstance(seconds, float):
        why = measured.get("error") or "no CPU time was measured"
        return Verdict(Status.FAILED, message=CANNOT_MEASURE.format(why=why))
    figures = {**figures, "seconds": seconds, "floor": floor, "limit": limit}
    if measured.get("stopped") or seconds > limit:
        return Verdict(
            Status.FAILED,
            message=say("recomputes", **figures),
            hint=say("reads_cache"),
            suspected_bug=bug,
        )
    return (
        f"CPU time {seconds:.2f} s, {floor / max(seconds, 0.01):.0f}x under the {floor:.1f} s a "
        f"recompute needs at this machine's rate: the cost of a cache"
    )


def with_cost(measured: Verdict | str, judged) -> Verdict:
    """The failing cost verdict, else the judged one with what was measured added."""
    if isinstance(measured, Verdict):
        return measured
    verdict = judged()
    verdict.message = f"{verdict.message} ({measured})" if verdict.message else measured
    return verdict


def cost_beside(measured: dict) -> str:
    """What the call cost, said beside a pass the swap proves (the cost decides nothing)."""
    seconds, floor = measured.get("cpu_seconds"), measured.get("floor")
    if not isinstance(seconds, float) or not isinstance(floor, float):
        return "its CPU time was not measured; the swap is the evidence"
    return (f"CPU time {seconds:.2f} s, where a recompute's arithmetic needs {floor:.2f} s on "
            f"this machine: the swap, not the cost, is the evidence")


def cut_short(measured: dict | None) -> bool:
    """A measured call that gave no answer to judge over a swap: stopped at its limit, or
    untrusted (it started a process, or could write the grader's install)."""
    return measured is not None and bool(measured.get("stopped") or measured.get("failure"))
