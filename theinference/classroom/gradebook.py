"""gradebook.csv: one row per student, its language, a column per stage (its score), the total
and the suspected bugs; and `gradebook merge`, which joins shards' results into one folder.

The gradebook holds nothing that varies from run to run (no timings), so a class graded in
shards and merged gives the same file, byte for byte, as the class graded at once. A merge told
the class (the students of the submissions folder at merge time) keeps exactly them: it drops
the records of students whose submission is gone and gives each student no shard graded a
"missing" row, so a shard that failed shows in the gradebook rather than as a shorter list.
"""

import csv
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.classroom.records import SUBMISSIONS_DIR, read_records, record_path
from theinference.results import Status
from theinference.results.submission import Record, StageRow
from theinference.results.text import csv_cell

GRADEBOOK = "gradebook.csv"
MISSING = "missing"  # the gradebook status of a student no shard's results hold


@dataclass(frozen=True)
class Merged:
    records: list[Record]  # the merged records, by student id
    dropped: list[str]  # records left out: their submission is no longer in the class
    missing: list[str]  # students of the class no shard graded


class MergeError(Exception):
    """Shards that cannot be joined; the message says which and why."""


def stage_slugs(records: list[Record]) -> list[str]:
    """Every stage any record has, in the order first seen (course order)."""
    slugs: list[str] = []
    for record in records:
        for row in record.rows:
            if row.slug not in slugs:
                slugs.append(row.slug)
    return slugs


def gradebook_text(records: list[Record]) -> str:
    slugs = stage_slugs(records)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", "status", "language", *slugs, "total", "max_total", "passed_stages",
                     "suspected_bugs", "message", "content_sha256", "sandbox"])
    for record in records:
        rows = record.rows
        by_slug = {row.slug: row for row in rows}
        writer.writerow([
            csv_cell(record.id),  # a file name: never a spreadsheet formula
            record.status,
            record.language or "",
            *(_cell(by_slug.get(slug)) for slug in slugs),
            _number(record.score),
            _number(record.max_score),
            f"{sum(r.status == Status.PASSED for r in rows)}/{len(rows)}",
            "; ".join(f"{r.slug}: {r.suspected_bug}" for r in rows if r.suspected_bug),
            csv_cell(record.message[:300]),
            record.content_sha256,
            record.sandbox or "",  # how the student's process was isolated
        ])
    return out.getvalue()


def _cell(row: StageRow | None) -> str:
    return "" if row is None else _number(row.score)


def _number(x: float) -> str:
    return f"{x:g}"


def write_gradebook(results_dir: Path, records: list[Record] | None = None) -> Path:
    records = read_records(results_dir) if records is None else records
    path = results_dir / GRADEBOOK
    atomic_write(path, gradebook_text(sorted(records, key=lambda r: r.id)))
    return path


def merge(shards: list[Path], out: Path, students: list[str] | None = None) -> Merged:
    """Every shard's records copied into `out`, then one gradebook of them all. The same
    student in two shards must have been graded from the same content under the same plan.
    With `students` (the class now), the merge keeps exactly them: other records are dropped
    (from `out` too, where an earlier merge left them) and students without one are missing."""
    chosen = _chosen_records(shards)
    dropped = sorted(set(chosen) - set(students)) if students is not None else []
    missing = sorted(set(students) - set(chosen)) if students is not None else []
    for sid in dropped:
        del chosen[sid]
    _copy_records(chosen, out, students)
    records = sorted((record for record, _ in chosen.values()), key=lambda r: r.id)
    atomic_write(out / GRADEBOOK, gradebook_text(
        sorted(records + [missing_row(sid) for sid in missing], key=lambda r: r.id)))
    return Merged(records, dropped, missing)


def _chosen_records(shards: list[Path]) -> dict[str, tuple[Record, Path]]:
    """Each student's record and the shard it comes from; conflicting grades refused."""
    chosen: dict[str, tuple[Record, Path]] = {}
    for shard in shards:
        if not (shard / SUBMISSIONS_DIR).is_dir():
            raise MergeError(f"{shard} holds no graded submissions ({SUBMISSIONS_DIR}/)")
        for record in read_records(shard):
            seen = chosen.get(record.id)
            if seen and (seen[0].content_sha256, seen[0].plan_key) != (
                record.content_sha256, record.plan_key
            ):
                raise MergeError(
                    f"{record.id} was graded differently in {seen[1]} and {shard} "
                    "(other content or other settings): regrade one of them"
                )
            chosen[record.id] = (record, shard)
    return chosen


def _copy_records(chosen: dict[str, tuple[Record, Path]], out: Path,
                  students: list[str] | None) -> None:
    """The chosen records into `out`; with the class known, any other record there removed
    (an earlier merge's student whose submission is gone, or whose shard failed this time)."""
    for sid, (_record, shard) in chosen.items():
        target = record_path(out, sid)
        if target.resolve() != record_path(shard, sid).resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record_path(shard, sid), target)
    if students is not None:
        for record in read_records(out):
            if record.id not in chosen:
                record_path(out, record.id).unlink()


def missing_row(sid: str) -> Record:
    """The gradebook row of a student of the class whom no shard graded."""
    return Record(sid, MISSING,
                  message="no shard's results hold this submission: submit the workflow again")
