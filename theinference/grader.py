"""One grading run: stages in order, each case asked of the student's process, judged here.

The oracle runs after the student's call, not beside it: both use every core through BLAS, and
overlapping them on a small machine made each several times slower. It also runs only when
there is something to compare (a todo or an error costs no oracle time), and its answers are
cached per weights file (oracle_cache.py).
"""

import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from theinference.checks import CHECKS, OracleRuns, Verdict
from theinference.fingerprints import BY_ID, Diagnosis, diagnose
from theinference.oracle_cache import OracleCache
from theinference.results import CaseResult, RunResult, StageResult, Status, stage_status
from theinference.runner import Limits, Outcome, Worker
from theinference.stages import Case, Stage
from theinference.weights import Weights

OUTCOME_STATUS = {
    "todo": Status.TODO,
    "timeout": Status.TIMEOUT,
}
BLOCKING = {Status.FAILED, Status.ERROR, Status.TIMEOUT, Status.SKIPPED}


class Oracle:
    """The oracle's answers for one weights file: from the cache, else computed."""

    def __init__(self, weights: Weights, cache: OracleCache | None = None):
        self.runs = OracleRuns(weights.tensors, weights.config)
        self.cache = cache or OracleCache(weights.sha256, None)

    def expected(self, check_name: str, args: list):
        def compute():
            return CHECKS[check_name].expect(self.runs, args)

        return self.cache.get_or_compute(check_name, args, compute)

    def noise(self, check_name: str, args: list) -> float | None:
        """max |oracle - the same along the cached path|: the float32 drift any correct
        solution shows for this case (None where the check has no second path)."""
        second = CHECKS[check_name].second_path
        if second is None:
            return None

        def compute():
            drift = np.abs(self.expected(check_name, args) - second(self.runs, args)).max()
            return np.asarray(drift, dtype=np.float64)

        return float(self.cache.get_or_compute(check_name + ":noise", args, compute))


def grade(
    course_dir: Path,
    stages: list[Stage],
    weights: Weights,
    limits: Limits,
    oracle: Oracle | None = None,
    cancel: threading.Event | None = None,
) -> RunResult:
    """Grade the stages in order. `cancel`, set from another thread, stops the run early;
    its result is then marked cancelled."""
    started = time.monotonic()
    oracle = oracle or Oracle(weights)
    cancel = cancel or threading.Event()
    results: dict[str, StageResult] = {}
    with Worker(course_dir, weights.path, limits, cancel) as worker:
        for stage in stages:
            if cancel.is_set():
                break
            blocker = first_blocker(stage, results)
            if blocker:
                results[stage.slug] = StageResult(
                    stage.slug,
                    stage.title,
                    Status.SKIPPED,
                    reason=blocker,
                    score_weight=stage.score,
                )
                continue
            results[stage.slug] = grade_stage(stage, worker, oracle, cancel, limits)
        startups, startup_seconds = worker.startups, worker.startup_seconds
    return RunResult(
        stages=list(results.values()),
        weights_label=weights.label,
        weights_sha256=weights.sha256,
        seconds=time.monotonic() - started,
        worker_startups=startups,
        worker_startup_seconds=startup_seconds,
        cancelled=cancel.is_set(),
    )


def first_blocker(stage: Stage, results: dict[str, StageResult]) -> str:
    """Why a stage cannot be graded: a prerequisite in this run that failed. A prerequisite
    that is only todo blocks nothing: each stage's own stubs say what is missing."""
    for req in stage.requires:
        done = results.get(req)
        if done is not None and done.status in BLOCKING:
            verb = "was" if done.status == Status.SKIPPED else "is"
            return f"requires {req}, which {verb} {done.status.value}"
    return ""


def grade_stage(
    stage: Stage, worker: Worker, oracle: Oracle, cancel: threading.Event, run_limits: Limits
) -> StageResult:
    started = time.monotonic()
    worker.use_limits(stage_limits(stage, run_limits))
    graded: list[tuple[CaseResult, list, Verdict]] = []
    for case in stage.cases:
        if cancel.is_set():
            break
        graded.append(grade_case(stage, case, worker, oracle))
    cases = [result for result, _, _ in graded]
    diagnosis = Diagnosis()
    if any(c.status == Status.FAILED for c in cases) and not cancel.is_set():
        diagnosis = fingerprint_smallest_failure(stage, graded, oracle)
    return StageResult(
        stage.slug,
        stage.title,
        stage_status(cases),
        cases,
        seconds=time.monotonic() - started,
        score_weight=stage.score,
        suspected_bug=diagnosis.bug.id if diagnosis.bug else None,
        candidates=[b.id for b in diagnosis.candidates],
        hint=diagnosis.hint,
    )


def stage_limits(stage: Stage, run: Limits) -> Limits:
    """The stage spec's own limits where it sets them, else the run's."""
    return replace(
        run,
        timeout=stage.timeout,
        memory_bytes=stage.memory_bytes or run.memory_bytes,
        output_bytes=stage.output_bytes or run.output_bytes,
    )


def fingerprint_smallest_failure(stage: Stage, graded: list, oracle: Oracle) -> Diagnosis:
    """Try the bug catalogue on the failing cases, smallest first: one diagnosis per stage,
    at the cost of a few small forwards, and only when something failed."""
    failing = sorted(
        ((result, args, verdict) for result, args, verdict in graded if verdict.actual is not None),
        key=lambda item: len(str(item[1])),
    )
    if not failing:
        return Diagnosis()
    checks = {c.name: c.check for c in stage.cases}
    diagnosis = diagnose(
        [(checks[result.name], args, verdict.actual) for result, args, verdict in failing],
        stage.tolerance,
        oracle.runs.w,
        oracle.runs.config,
    )
    smallest = failing[0][0]
    smallest.fingerprinted = True
    if diagnosis.hint:
        smallest.suspected_bug = diagnosis.bug.id if diagnosis.bug else None
        smallest.hint = diagnosis.hint
    return diagnosis


def grade_case(
    stage: Stage, case: Case, worker: Worker, oracle: Oracle
) -> tuple[CaseResult, list, Verdict]:
    check = CHECKS[case.check]
    config = oracle.runs.config
    args = check.arguments(case, config)
    outcome = worker.call(check.adapter, args, stage.timeout, check.probe)
    oracle_seconds = 0.0

    def ask(question: list):
        nonlocal oracle_seconds
        started = time.monotonic()
        try:
            return oracle.expected(case.check, question)
        finally:
            oracle_seconds += time.monotonic() - started

    if case.inputs.get("must_raise"):
        verdict = verdict_for_must_raise(outcome, case)
    elif outcome.kind == "returned":
        value = (outcome.value, outcome.probe) if check.probe else outcome.value
        verdict = check.judge(value, args, ask, stage.tolerance, config)
        if check.second_path is not None and verdict.comparisons:
            noise_started = time.monotonic()
            noise = oracle.noise(case.check, args)
            oracle_seconds += time.monotonic() - noise_started
            verdict.comparisons = [replace(c, noise=noise) for c in verdict.comparisons]
    else:
        verdict = verdict_without_value(outcome)
    hint = verdict.hint
    if verdict.suspected_bug in BY_ID:  # recognised by the judge itself (shape, probe)
        bug = BY_ID[verdict.suspected_bug]
        hint = f"suspected bug: {bug.name}. {bug.hint} {hint}".strip()
    result = CaseResult(
        name=case.name,
        status=verdict.status,
        message=verdict.message,
        hint=hint,
        comparisons=verdict.comparisons,
        steps=verdict.steps,
        tokens=verdict.tokens,
        traceback=outcome.traceback,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        student_seconds=outcome.seconds,
        oracle_seconds=oracle_seconds,
        suspected_bug=verdict.suspected_bug,
        fingerprinted=verdict.suspected_bug is not None,
    )
    return result, args, verdict


def verdict_for_must_raise(outcome: Outcome, case: Case) -> Verdict:
    """A case whose request is invalid (e.g. generating past the context): the student's code
    must refuse it with the exception the template names, not crash into it later."""
    wanted = case.inputs.get("raises", "ValueError")
    if outcome.kind == "raised" and outcome.exception == wanted:
        return Verdict(Status.PASSED, message=f"raised {outcome.message}, as it should")
    if outcome.kind == "raised":
        return Verdict(
            Status.FAILED,
            message=f"{case.inputs['must_raise']}: it raised {outcome.message} instead of "
            f"{wanted}. Check the request up front and raise {wanted}.",
        )
    if outcome.kind == "returned":
        return Verdict(Status.FAILED, message=f"{case.inputs['must_raise']}: it returned")
    return verdict_without_value(outcome)


def verdict_without_value(outcome: Outcome) -> Verdict:
    """todo, timeout, or an error: the call gave nothing to compare."""
    status = OUTCOME_STATUS.get(outcome.kind, Status.ERROR)
    return Verdict(status, message=outcome.message)
