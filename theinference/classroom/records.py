"""One record per graded submission (RESULTS/submissions/ID.json): what was graded, its
content hash, the run it came to (stored as `theinference test --format json` writes it) and
each stage's row, with its score.

The gradebook, shard merging and the class report all read these records and nothing else,
so they can never disagree with one another or with the per-submission JSON. A record is a
Record (results/submission.py) from the moment it is read: no module indexes its JSON, nor
that of the run inside it.
"""

import json
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.course.settings import Grading
from theinference.grading.scores import stage_score, suspected_bug_of
from theinference.results import RunResult, StageResult, Status
from theinference.results.submission import (
    NOT_GRADED,
    Record,
    StageRow,
    record_from_json,
    record_json,
)

SUBMISSIONS_DIR = "submissions"
FINAL = ("graded", "rejected")  # a rerun keeps these; a grader error is tried again


def stage_rows(results: RunResult | None, points: dict[str, float],
               grading: Grading) -> list[StageRow]:
    """Each planned stage's status and score; a stage the run did not reach scores 0."""
    by_slug = {s.slug: s for s in (results.stages if results else [])}
    rows = []
    for slug, max_score in points.items():
        stage = by_slug.get(slug)
        if stage is None:
            rows.append(StageRow(slug, NOT_GRADED, 0.0, max_score))
            continue
        rows.append(StageRow(
            slug, stage.status.value, stage_score(stage, max_score, grading), max_score,
            suspected_bug_of(stage), worst_error(stage),
            sum(c.status == Status.PASSED for c in stage.cases), len(stage.cases),
        ))
    return rows


def worst_error(stage: StageResult) -> float | None:
    """The largest error of any comparison in the stage, in tolerances (None: no figures)."""
    return max((c.worst for c in stage.cases if c.worst is not None), default=None)


def record_path(results_dir: Path, sid: str) -> Path:
    return results_dir / SUBMISSIONS_DIR / f"{sid}.json"


def write_record(results_dir: Path, record: Record) -> None:
    text = json.dumps(record_json(record), indent=2) + "\n"
    atomic_write(record_path(results_dir, record.id), text)


def read_record(path: Path) -> Record | None:
    """The record at `path`; None when there is none, or it is damaged or another version's
    (a regrade then grades that submission anew)."""
    try:
        return record_from_json(json.loads(path.read_text()))
    except (OSError, ValueError, RecursionError):  # ResultsError is a ValueError
        return None


def read_records(results_dir: Path) -> list[Record]:
    """Every readable record in a results folder, sorted by student id."""
    folder = results_dir / SUBMISSIONS_DIR
    records = [read_record(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted((r for r in records if r), key=lambda r: r.id)
