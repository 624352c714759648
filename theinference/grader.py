"""One grading run: stages in order, each case asked of the student's process, judged here.

The oracle runs after the student's call, not beside it: both use every core through BLAS, and
overlapping them on a small machine made each several times slower. It also runs only when
there is something to compare (a todo or an error costs no oracle time).
"""

import time
from pathlib import Path

from theinference.checks import CHECKS, OracleRuns, Verdict
from theinference.results import CaseResult, RunResult, StageResult, Status, stage_status
from theinference.runner import Limits, Outcome, Worker
from theinference.stages import Case, Stage
from theinference.weights import Weights

OUTCOME_STATUS = {
    "todo": Status.TODO,
    "timeout": Status.TIMEOUT,
}


def grade(course_dir: Path, stages: list[Stage], weights: Weights, limits: Limits) -> RunResult:
    started = time.monotonic()
    runs = OracleRuns(weights.tensors, weights.config)
    results: dict[str, StageResult] = {}
    with Worker(course_dir, weights.path, limits) as worker:
        for stage in stages:
            blocker = first_blocker(stage, results)
            if blocker:
                results[stage.slug] = StageResult(
                    stage.slug, stage.title, Status.SKIPPED, reason=blocker
                )
                continue
            results[stage.slug] = grade_stage(stage, worker, runs)
        startups = worker.startups
    return RunResult(
        stages=list(results.values()),
        weights_label=weights.label,
        weights_sha256=weights.sha256,
        seconds=time.monotonic() - started,
        worker_startups=startups,
    )


BLOCKING = {Status.FAILED, Status.ERROR, Status.TIMEOUT, Status.SKIPPED}


def first_blocker(stage: Stage, results: dict[str, StageResult]) -> str:
    """Why a stage cannot be graded: a prerequisite in this run that failed. A prerequisite
    that is only todo blocks nothing: each stage's own stubs say what is missing."""
    for req in stage.requires:
        done = results.get(req)
        if done is not None and done.status in BLOCKING:
            return (
                f"requires {req}, which {'was' if done.status == Status.SKIPPED else 'is'} "
                f"{done.status.value}"
            )
    return ""


def grade_stage(stage: Stage, worker: Worker, runs: OracleRuns) -> StageResult:
    started = time.monotonic()
    cases = [grade_case(stage, case, worker, runs) for case in stage.cases]
    return StageResult(
        stage.slug, stage.title, stage_status(cases), cases, seconds=time.monotonic() - started
    )


def grade_case(stage: Stage, case: Case, worker: Worker, runs: OracleRuns) -> CaseResult:
    check = CHECKS[case.check]
    args = check.arguments(case, runs.config)
    outcome = worker.call(check.adapter, args, stage.timeout)
    oracle_seconds = 0.0
    if outcome.kind == "returned":
        oracle_started = time.monotonic()
        expected = check.expect(runs, args)
        oracle_seconds = time.monotonic() - oracle_started
        verdict = check.judge(outcome.value, expected, stage.tolerance, runs.config)
    else:
        verdict = verdict_without_value(outcome)
    return CaseResult(
        name=case.name,
        status=verdict.status,
        message=verdict.message,
        hint=verdict.hint,
        comparisons=verdict.comparisons,
        traceback=outcome.traceback,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        student_seconds=outcome.seconds,
        oracle_seconds=oracle_seconds,
    )


def verdict_without_value(outcome: Outcome) -> Verdict:
    """todo, timeout, or an error: the call gave nothing to compare."""
    status = OUTCOME_STATUS.get(outcome.kind, Status.ERROR)
    return Verdict(status, message=outcome.message)
