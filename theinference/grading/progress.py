"""The student's last result per stage, kept in the course directory (.theinference/), so
`theinference stages` can show where they are. A small file, replaced atomically; losing it
loses nothing but this summary."""

import json
from datetime import UTC, datetime
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.results import RunResult, StageResult, Status

PROGRESS_FILE = Path(".theinference") / "progress.json"


def read_progress(course_root: Path) -> dict[str, dict]:
    try:
        data = json.loads((course_root / PROGRESS_FILE).read_text())
        return data.get("stages", {}) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def failed_stages(course_root: Path) -> frozenset[str]:
    """The stages whose last recorded result failed on its numbers: the grader asks their
    first cases over the student's own cache first (grading/own_cache.py). Only an order of
    asking: whatever this file says, every verdict rests on the same calls' evidence."""
    return frozenset(slug for slug, last in read_progress(course_root).items()
                     if isinstance(last, dict) and last.get("status") == Status.FAILED.value)


def worth_recording(stage: StageResult) -> bool:
    """A pass on some cases only (--case, --quick, stopped early) is not a pass of the stage;
    what it found wrong still is news."""
    return not (stage.partial and stage.status in (Status.PASSED, Status.SKIPPED))


def record_progress(course_root: Path, run: RunResult) -> None:
    if run.cancelled:
        return
    stages = read_progress(course_root)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for s in run.stages:
        if worth_recording(s):
            stages[s.slug] = {
                "status": s.status.value,
                "updated": now,
                "weights": run.weights_label,
            }
    data = json.dumps({"version": 1, "stages": stages}, indent=2)
    try:
        atomic_write(course_root / PROGRESS_FILE, data)
    except OSError:
        pass  # a read-only course directory still grades; only the summary is lost
