"""One record per graded submission (RESULTS/submissions/ID.json): what was graded, its
content hash, and the `theinference test` JSON it came to, with each stage's score.

The gradebook, shard merging and the class report all read these records and nothing else,
so they can never disagree with one another or with the per-submission JSON.
"""

import json
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.course.settings import Grading
from theinference.grading.scores import stage_score, suspected_bug_of

SCHEMA = "theinference.submission/1"
SUBMISSIONS_DIR = "submissions"
FINAL = ("graded", "rejected")  # a rerun keeps these; a grader error is tried again


def stage_rows(results: dict | None, points: dict[str, float], grading: Grading) -> list[dict]:
    """Each planned stage's status and score; a stage the run did not reach scores 0."""
    by_slug = {s["slug"]: s for s in (results or {}).get("stages", [])}
    rows = []
    for slug, max_score in points.items():
        stage = by_slug.get(slug)
        if stage is None:
            rows.append(_row(slug, "not graded", (0.0, max_score)))
            continue
        cases = stage.get("cases", [])
        score = stage_score(stage, max_score, grading)
        passed = sum(c["status"] == "passed" for c in cases)
        rows.append(_row(slug, stage["status"], (score, max_score), (passed, len(cases)),
                         suspected_bug_of(stage), worst_error(stage)))
    return rows


def worst_error(stage: dict) -> float | None:
    """The largest error of any comparison in the stage, in tolerances (None: no figures)."""
    figures = [
        cmp["worst_tolerance_multiple"]
        for case in stage.get("cases", [])
        for cmp in case.get("comparisons", [])
        if cmp.get("worst_tolerance_multiple") is not None
    ]
    return max(figures) if figures else None


def _row(slug, status, points: tuple, cases: tuple = (0, 0), bug=None, worst=None) -> dict:
    """points: (score, max_score); cases: (passed, total)."""
    return {
        "slug": slug,
        "status": status,
        "score": points[0],
        "max_score": points[1],
        "suspected_bug": bug,
        "worst_tolerance_multiple": worst,
        "cases_passed": cases[0],
        "cases_total": cases[1],
    }


def record_path(results_dir: Path, sid: str) -> Path:
    return results_dir / SUBMISSIONS_DIR / f"{sid}.json"


def write_record(results_dir: Path, record: dict) -> None:
    atomic_write(record_path(results_dir, record["id"]), json.dumps(record, indent=2) + "\n")


def read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("schema") == SCHEMA else None


def read_records(results_dir: Path) -> list[dict]:
    """Every readable record in a results folder, sorted by student id."""
    folder = results_dir / SUBMISSIONS_DIR
    records = [read_record(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted((r for r in records if r), key=lambda r: r["id"])
