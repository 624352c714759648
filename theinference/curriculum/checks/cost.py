"""The behavioural cache-use check, for any layout: the student's own CPU time for a cached
operation against their own recompute of the same length, both measured by the grader from
outside their process (never by their process, which could forge it).

A cache makes the cached operation cost about as much as the recompute (the prompt is
processed once, each later token costs one row); recomputing instead costs many times more.
The margin each stage allows sits between the two, far from both."""

from collections.abc import Callable

from theinference.curriculum.checks.common import Verdict, Words
from theinference.results import Status


def baseline_probe(adapter: str, args: list) -> dict:
    """Ask the grader to time `adapter(*args)` first, then the case's own call."""
    return {"kind": "cpu_against", "baseline": {"adapter": adapter, "args": args}}


def is_baseline_probe(probe: dict | None) -> bool:
    return isinstance(probe, dict) and probe.get("kind") == "cpu_against"


def call_against_baseline(process, adapter: str, args: list, timeout: float, probe: dict):
    """Two calls, each timed by the grader from outside the student's process (see
    process_cpu): the baseline (its value not sent back), then the case's own call, whose
    outcome gets the probe the verdict reads. Nothing the student's process reports is used."""
    baseline = probe["baseline"]
    first = process.call(baseline["adapter"], baseline["args"], timeout, discard=True)
    outcome = process.call(adapter, args, timeout)
    error = None
    if first.kind != "returned" or first.cpu_seconds is None:
        error = f"{baseline['adapter']}: {first.message or first.kind}"
    outcome.probe = {
        "kind": "cpu_against",
        "cpu_seconds": outcome.cpu_seconds,
        "baseline_cpu_seconds": None if error else first.cpu_seconds,
        "baseline_error": error,
    }
    return outcome


def cost_verdict(
    probe: dict | None, say: Words, figures: dict, bug: str | None = "decode-recomputes"
) -> Verdict | str:
    """What was measured, when the cost is that of a cache; else a failing verdict that says
    so. Never a pass when nothing could be measured."""
    probe = probe or {}
    seconds, baseline = probe.get("cpu_seconds"), probe.get("baseline_cpu_seconds")
    if not isinstance(seconds, float) or not isinstance(baseline, float) or baseline <= 0:
        why = probe.get("baseline_error") or "no CPU time was measured"
        return Verdict(
            Status.FAILED,
            message=f"the grader could not measure the CPU time of your own run over the same "
            f"{figures['total']} tokens to compare with ({why}), and a check that cannot apply "
            "does not pass",
        )
    ratio = seconds / baseline
    if ratio <= say.number("cost_margin"):
        return (
            f"CPU time {seconds:.2f} s, {ratio:.2f}x your own {baseline:.2f} s for the same "
            f"{figures['total']} tokens: the cost of a cache"
        )
    return Verdict(
        Status.FAILED,
        message=say("recomputes", seconds=seconds, baseline=baseline, ratio=ratio, **figures),
        hint=say("reads_cache"),
        suspected_bug=bug,
    )


def with_cost(measured: Verdict | str, judged: Callable[[], Verdict]) -> Verdict:
    """The failing cost verdict, else the judged one with what was measured added."""
    if isinstance(measured, Verdict):
        return measured
    verdict = judged()
    verdict.message = f"{verdict.message} ({measured})" if verdict.message else measured
    return verdict
