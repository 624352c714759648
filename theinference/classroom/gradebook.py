"""gradebook.csv: one row per student, its language, a column per stage (its score), the total
and the suspected bugs; and `gradebook merge`, which joins shards' results into one folder.

The gradebook holds nothing that varies from run to run (no timings), so a class graded in
shards and merged gives the same file, byte for byte, as the class graded at once.
"""

import csv
import io
import shutil
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.classroom.records import SUBMISSIONS_DIR, read_records, record_path
from theinference.results.text import csv_cell

GRADEBOOK = "gradebook.csv"


class MergeError(Exception):
    """Shards that cannot be joined; the message says which and why."""


def stage_slugs(records: list[dict]) -> list[str]:
    """Every stage any record has, in the order first seen (course order)."""
    slugs: list[str] = []
    for record in records:
        for row in record["stages"]:
            if row["slug"] not in slugs:
                slugs.append(row["slug"])
    return slugs


def gradebook_text(records: list[dict]) -> str:
    slugs = stage_slugs(records)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", "status", "language", *slugs, "total", "max_total", "passed_stages",
                     "suspected_bugs", "message", "content_sha256", "sandbox"])
    for record in records:
        by_slug = {row["slug"]: row for row in record["stages"]}
        writer.writerow([
            csv_cell(record["id"]),  # a file name: never a spreadsheet formula
            record["status"],
            record.get("language") or "",
            *(_cell(by_slug.get(slug)) for slug in slugs),
            _number(record["score"]),
            _number(record["max_score"]),
            f"{sum(r['status'] == 'passed' for r in record['stages'])}/{len(record['stages'])}",
            "; ".join(f"{r['slug']}: {r['suspected_bug']}"
                      for r in record["stages"] if r["suspected_bug"]),
            csv_cell(record["message"][:300]),
            record["content_sha256"],
            record.get("sandbox") or "",  # how the student's process was isolated
        ])
    return out.getvalue()


def _cell(row: dict | None) -> str:
    return "" if row is None else _number(row["score"])


def _number(x: float) -> str:
    return f"{x:g}"


def write_gradebook(results_dir: Path, records: list[dict] | None = None) -> Path:
    records = read_records(results_dir) if records is None else records
    path = results_dir / GRADEBOOK
    atomic_write(path, gradebook_text(sorted(records, key=lambda r: r["id"])))
    return path


def merge(shards: list[Path], out: Path) -> list[dict]:
    """Every shard's records copied into `out`, then one gradebook of them all. The same
    student in two shards must have been graded from the same content under the same plan."""
    chosen: dict[str, tuple[dict, Path]] = {}
    for shard in shards:
        if not (shard / SUBMISSIONS_DIR).is_dir():
            raise MergeError(f"{shard} holds no graded submissions ({SUBMISSIONS_DIR}/)")
        for record in read_records(shard):
            seen = chosen.get(record["id"])
            if seen and (seen[0]["content_sha256"], seen[0]["plan_key"]) != (
                record["content_sha256"], record["plan_key"]
            ):
                raise MergeError(
                    f"{record['id']} was graded differently in {seen[1]} and {shard} "
                    "(other content or other settings): regrade one of them"
                )
            chosen[record["id"]] = (record, shard)
    for sid, (_record, shard) in chosen.items():
        target = record_path(out, sid)
        if target.resolve() != record_path(shard, sid).resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record_path(shard, sid), target)
    records = [record for record, _ in chosen.values()]
    write_gradebook(out, records)
    return sorted(records, key=lambda r: r["id"])
