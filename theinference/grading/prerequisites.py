"""What a stage needs before its cases are graded: its prerequisites in this run not failed
(a stage they block is skipped, saying which), and its own limits."""

from dataclasses import replace

from theinference.curriculum.stages import Stage
from theinference.results import StageResult, Status
from theinference.student.setup import Limits


def first_blocker(stage: Stage, results: dict[str, StageResult]) -> str:
    """Why a stage cannot be graded: a prerequisite in this run that failed. A prerequisite
    that is only todo blocks nothing: each stage's own stubs say what is missing."""
    for req in stage.requires:
        done = results.get(req)
        if done is not None and done.status in BLOCKED_BY:
            return f"requires {req}, which {BLOCKED_BY[done.status]}" + (
                f" ({done.reason})" if done.status == Status.SKIPPED and done.reason else ""
            )
    return ""


# a prerequisite's status in plain words: "requires build-prefill, which failed"
BLOCKED_BY = {
    Status.FAILED: "failed",
    Status.ERROR: "raised an error",
    Status.TIMEOUT: "timed out",
    Status.SKIPPED: "could not run",
}


def skipped(stage: Stage, reason: str) -> StageResult:
    return StageResult(
        stage.slug, stage.title, Status.SKIPPED, reason=reason, score_weight=stage.score
    )


def stage_limits(stage: Stage, run: Limits) -> Limits:
    """The stage spec's own limits where it sets them, else the run's."""
    return replace(
        run,
        timeout=stage.timeout,
        memory_bytes=stage.memory_bytes or run.memory_bytes,
        output_bytes=stage.output_bytes or run.output_bytes,
    )
