"""`gradebook diff OLD NEW`: after a regrade, whose grade moved, where, and why.

Each student whose score or a stage's status changed is listed per stage, with the old and
new status and score, the suspected bug and worst error, the cases added or removed, and the
provenance fields (grading/provenance.py) that differ between their two records: a changed
spec or settings hash is the grader's doing, a changed `content` the student's (a
resubmission). Read from the records alone, like every other view of a class.
"""

import csv
import io
from dataclasses import dataclass, field

from theinference.grading.provenance import flatten
from theinference.results.submission import Record, StageRow
from theinference.results.text import csv_cell, terminal_text

ABSENT = "absent"
ABSENT_ROW = StageRow("", ABSENT, 0.0, 0.0)  # a stage one of the two runs did not plan


@dataclass
class StageChange:
    student: str
    stage: str  # "" when the student is in one run only
    old_status: str
    new_status: str
    old_score: float
    new_score: float
    old_bug: str | None
    new_bug: str | None
    worst_error: float | None  # the new run's, in tolerances
    cases_added: list[str] = field(default_factory=list)
    cases_removed: list[str] = field(default_factory=list)
    because: list[str] = field(default_factory=list)  # provenance fields that differ


@dataclass
class Regrade:
    changes: list[StageChange]
    differing: dict[str, int]  # provenance field -> students whose two records differ there
    students: int  # in either run


def diff_records(old: list[Record], new: list[Record]) -> Regrade:
    """Every stage whose status or score moved between the two runs, student by student."""
    before, after = {r.id: r for r in old}, {r.id: r for r in new}
    changes: list[StageChange] = []
    differing: dict[str, int] = {}
    for sid in sorted(before.keys() | after.keys()):
        a, b = before.get(sid), after.get(sid)
        because = differing_fields(a, b)
        for name in because:
            differing[name] = differing.get(name, 0) + 1
        if a is None or b is None:
            changes.append(whole_student(sid, a, b, because))
            continue
        changes += stage_changes(sid, a, b, because)
    return Regrade(changes, differing, len(before.keys() | after.keys()))


def differing_fields(a: Record | None, b: Record | None) -> list[str]:
    """Provenance fields whose values differ, and `content` for a resubmission."""
    if a is None or b is None:
        return []
    old, new = flatten(a.provenance), flatten(b.provenance)
    old["content"], new["content"] = a.content_sha256, b.content_sha256
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def whole_student(sid: str, a: Record | None, b: Record | None,
                  because: list[str]) -> StageChange:
    """A student graded in one run only."""
    return StageChange(
        student=sid, stage="",
        old_status=a.status if a else ABSENT, new_status=b.status if b else ABSENT,
        old_score=a.score if a else 0.0, new_score=b.score if b else 0.0,
        old_bug=None, new_bug=None, worst_error=None, because=because,
    )


def stage_changes(sid: str, a: Record, b: Record, because: list[str]) -> list[StageChange]:
    rows_a = {r.slug: r for r in a.rows}
    rows_b = {r.slug: r for r in b.rows}
    cases_a, cases_b = case_names(a), case_names(b)
    out = []
    for slug in [*rows_a, *(s for s in rows_b if s not in rows_a)]:
        x, y = rows_a.get(slug, ABSENT_ROW), rows_b.get(slug, ABSENT_ROW)
        if (x.status, x.score) == (y.status, y.score):
            continue
        before, after = cases_a.get(slug, []), cases_b.get(slug, [])
        out.append(StageChange(
            student=sid, stage=slug, old_status=x.status, new_status=y.status,
            old_score=x.score, new_score=y.score,
            old_bug=x.suspected_bug, new_bug=y.suspected_bug,
            worst_error=y.worst_tolerance_multiple,
            cases_added=[c for c in after if c not in before],
            cases_removed=[c for c in before if c not in after],
            because=because,
        ))
    return out


def case_names(record: Record) -> dict[str, list[str]]:
    """slug -> the names of the cases its run graded."""
    stages = record.results.stages if record.results else []
    return {s.slug: [c.name for c in s.cases] for s in stages}


# --- text and CSV ------------------------------------------------------------------------------


CSV_COLUMNS = ["student", "stage", "old_status", "new_status", "old_score", "new_score",
               "old_suspected_bug", "new_suspected_bug", "worst_error", "cases_added",
               "cases_removed", "changed_provenance"]


def csv_text(regrade: Regrade) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in regrade.changes:
        writer.writerow([csv_cell(c.student), c.stage, c.old_status, c.new_status,
                         f"{c.old_score:g}", f"{c.new_score:g}", c.old_bug or "",
                         c.new_bug or "", "" if c.worst_error is None else f"{c.worst_error:.4g}",
                         "; ".join(c.cases_added), "; ".join(c.cases_removed),
                         "; ".join(c.because)])
    return out.getvalue()


def text(regrade: Regrade) -> str:
    """What a terminal shows: the provenance that moved, then one line per change."""
    if not regrade.changes and not regrade.differing:
        return f"no change: {regrade.students} students, the same grades from the same inputs\n"
    lines = []
    if regrade.differing:
        moved = ", ".join(f"{name} ({count} of {regrade.students})"
                          for name, count in sorted(regrade.differing.items()))
        lines.append(f"provenance that differs: {moved}")
    if not regrade.changes:
        lines.append("no grade changed")
    for c in regrade.changes:
        lines.append(change_line(c))
    return "\n".join(lines) + "\n"


def change_line(c: StageChange) -> str:
    where = f"{terminal_text(c.student)} {c.stage}".strip()  # a student id is a file name
    parts = [f"{where}: {c.old_status} -> {c.new_status}, score {c.old_score:g} -> "
             f"{c.new_score:g}"]
    if c.old_bug or c.new_bug:
        parts.append(f"suspected bug {c.old_bug or '-'} -> {c.new_bug or '-'}")
    if c.worst_error is not None:
        parts.append(f"worst error {c.worst_error:.3g}x tolerance")
    if c.cases_added:
        parts.append("cases added: " + ", ".join(c.cases_added))
    if c.cases_removed:
        parts.append("cases removed: " + ", ".join(c.cases_removed))
    parts.append("because " + (", ".join(c.because) if c.because else "nothing recorded changed"))
    return "; ".join(parts)
