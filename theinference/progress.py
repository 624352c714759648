"""The student's last result per stage, kept in the course directory (.theinference/), so
`theinference stages` can show where they are. A small file, replaced atomically; losing it
loses nothing but this summary."""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from theinference.results import RunResult

PROGRESS_FILE = Path(".theinference") / "progress.json"


def read_progress(course_root: Path) -> dict[str, dict]:
    try:
        data = json.loads((course_root / PROGRESS_FILE).read_text())
        return data.get("stages", {}) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record_progress(course_root: Path, run: RunResult) -> None:
    if run.cancelled:
        return
    stages = read_progress(course_root)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for s in run.stages:
        stages[s.slug] = {"status": s.status.value, "updated": now, "weights": run.weights_label}
    path = course_root / PROGRESS_FILE
    try:
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".progress.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": 1, "stages": stages}, indent=2))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only course directory still grades; only the summary is lost
