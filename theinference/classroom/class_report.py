"""`theinference report RESULTS --html class.html`: what the class gets right and wrong, as one
static page (inline SVG, no script, nothing fetched at view time) and a page per student.

Every figure is computed from the submission records, the same ones gradebook.csv is made of.
"""

import math
from collections import Counter
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.classroom.gradebook import stage_slugs
from theinference.classroom.report_sections import has_share, job_text
from theinference.classroom.svg import bar_chart, histogram
from theinference.course import languages
from theinference.results import StageResult, Status, where_text
from theinference.results.submission import Record
from theinference.results.text import html_text as escape  # controls shown, not kept

STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .6em}
th{background:#f3f3f3}.passed{color:#17692b}.failed,.error,.timeout{color:#b3261e}
.todo,.skipped,.rejected{color:#8a6d00}section{margin-bottom:2em}"""


def class_summary(records: list[Record]) -> dict:
    """Plain figures the page shows (and the tests check against the records)."""
    slugs = stage_slugs(records)
    graded = [r for r in records if r.status == "graded"]
    rows = {slug: [s for r in graded for s in r.rows if s.slug == slug] for slug in slugs}
    return {
        "students": len(records),
        "graded": len(graded),
        "languages": Counter(language_name(r) for r in records if r.language),
        "pass_rate": {
            slug: (sum(s.status == Status.PASSED for s in rows[slug]) / len(rows[slug]))
            if rows[slug] else 0.0
            for slug in slugs
        },
        "bugs": {
            slug: Counter(r.suspected_bug for r in rows[slug] if r.suspected_bug).most_common()
            for slug in slugs
        },
        "worst": [w for r in graded if (w := student_worst(r)) is not None],
        "seconds": [student_seconds(r) for r in graded],
    }


def language_name(record: Record) -> str:
    """The record's language as reports name it ("" when it has none known)."""
    try:
        return languages.by_name(record.language or "").title
    except languages.LanguageError:
        return ""


def log_tolerances(worst: float) -> float:
    """log10 of an error in tolerances, NaN and Inf shown at the far right (1e12)."""
    if not math.isfinite(worst):
        return 12.0
    return math.log10(min(max(worst, 1e-6), 1e12))


def student_worst(record: Record) -> float | None:
    figures = [s.worst_tolerance_multiple for s in record.rows
               if s.worst_tolerance_multiple is not None]
    return max(figures) if figures else None


def student_seconds(record: Record) -> float:
    return round(record.results.student_seconds, 4) if record.results else 0.0


def write_report(records: list[Record], out: Path, sections: tuple[str, ...] = ()) -> list[Path]:
    """The class page at `out` (with `sections`: report_sections.py's, before the students
    table), each student's beside it in `<stem>-students/`."""
    folder = out.with_name(f"{out.stem}-students")
    written = []
    for record in records:
        path = folder / f"{record.id}.html"
        atomic_write(path, page(record.id, student_body(record)))
        written.append(path)
    atomic_write(out, page("Class report", class_body(records, folder.name, sections)))
    return [out, *written]


def page(title: str, body: str) -> str:
    return (f"<!doctype html>\n<html lang=en><head><meta charset=utf-8><title>{escape(title)}"
            f"</title><style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


def class_body(records: list[Record], folder: str, sections: tuple[str, ...] = ()) -> str:
    s = class_summary(records)
    slugs = list(s["pass_rate"])
    worst_logs = [log_tolerances(w) for w in s["worst"]]
    languages = ", ".join(f"{count} {name}" for name, count in sorted(s["languages"].items()))
    parts = [
        f"<h1>Class report</h1><p id=counts>{s['students']} submissions"
        f"{f' ({escape(languages)})' if languages else ''}, {s['graded']} graded.</p>",
        "<section id=pass-rate><h2>Pass rate per stage</h2>",
        bar_chart([(slug, s["pass_rate"][slug]) for slug in slugs], percent=True),
        "</section><section id=bugs><h2>Most common suspected bugs</h2>",
        bugs_table(s["bugs"]),
        "</section><section id=worst-error><h2>Worst error per student "
        "(in tolerances, log scale; below 1 passes)</h2>",
        histogram(worst_logs, "worst error / tolerance (log scale)", mark=0.0, log=True),
        "</section><section id=run-time><h2>Student code run time (seconds)</h2>",
        histogram(s["seconds"], "seconds in the student's calls"),
        "</section>",
        *sections,
        "<section id=students><h2>Students</h2>",
        students_table(records, slugs, folder),
        "</section>",
    ]
    return "\n".join(parts)


def bugs_table(bugs: dict[str, list]) -> str:
    rows = [f"<tr><td>{escape(slug)}</td><td>{escape(bug)}</td><td>{count}</td></tr>"
            for slug, found in bugs.items() for bug, count in found[:5]]
    if not rows:
        return "<p>No catalogued bug was recognised.</p>"
    return ("<table><tr><th>stage</th><th>suspected bug</th><th>students</th></tr>"
            + "".join(rows) + "</table>")


def students_table(records: list[Record], slugs: list[str], folder: str) -> str:
    head = "".join(f"<th>{escape(slug)}</th>" for slug in slugs)
    rows = []
    for r in records:
        by_slug = {s.slug: s.status for s in r.rows}
        cells = "".join(f"<td class={escape(by_slug.get(slug, ''))}>"
                        f"{escape(by_slug.get(slug, ''))}</td>" for slug in slugs)
        link = f"{folder}/{escape(r.id)}.html"
        rows.append(f"<tr><td><a href=\"{link}\">{escape(r.id)}</a></td>"
                    f"<td class={escape(r.status)}>{escape(r.status)}</td>"
                    f"<td>{escape(language_name(r))}</td>"
                    f"<td>{r.score:g}/{r.max_score:g}</td>{cells}</tr>")
    return ("<table><tr><th>student</th><th>status</th><th>language</th><th>score</th>" + head
            + "</tr>"
            + "".join(rows) + "</table>")


def student_body(record: Record) -> str:
    parts = [f"<h1>{escape(record.id)}</h1>",
             f"<p>{escape(record.status)}: {record.score:g} of {record.max_score:g} "
             f"points{f' ({language_name(record)})' if language_name(record) else ''}. "
             f"{escape(record.message)}</p>",
             *graded_with(record),
             "<table><tr><th>stage</th><th>status</th><th>score</th><th>cases passed</th>"
             "<th>suspected bug</th><th>worst error (× tolerance)</th></tr>"]
    for s in record.rows:
        worst = s.worst_tolerance_multiple
        parts.append(
            f"<tr><td>{escape(s.slug)}</td><td class={escape(s.status)}>"
            f"{escape(s.status)}</td><td>{s.score:g}/{s.max_score:g}</td>"
            f"<td>{s.cases_passed}/{s.cases_total}</td>"
            f"<td>{escape(s.suspected_bug or '')}</td>"
            f"<td>{'' if worst is None else f'{worst:.3g}'}</td></tr>")
    parts.append("</table>")
    for stage in record.results.stages if record.results else []:
        parts += stage_diagnosis(stage)
        for case in stage.cases:
            if case.status != Status.PASSED:
                parts.append(f"<h3>{escape(stage.slug)}: {escape(case.name)}</h3>"
                             f"<pre>{escape(case.message[:2000])}</pre>")
    return "\n".join(parts)


def graded_with(record: Record) -> list[str]:
    """The sandbox and the job's share of the allocation, when the record says."""
    said = []
    if record.sandbox:
        said.append(f"sandbox {escape(record.sandbox)}")
    if has_share(record):
        said.append(escape(job_text(record.allocation)))
    return [f"<p class=graded-with>Graded with {'; '.join(said)}.</p>"] if said else []


def stage_diagnosis(stage: StageResult) -> list[str]:
    """What the student was told about a stage that did not pass: the suspected bug (or the
    error's lesson) in words, where it departs, the hint (the grader's own, from the results)."""
    said = [("suspected bug", stage.bug_name), ("error lesson", stage.lesson),
            ("hint", stage.hint)]
    if stage.where:
        said.append(("first departs at", where_text(stage.where)))
    lines = [f"<li>{label}: {escape(str(text))}</li>" for label, text in said if text]
    if not lines:
        return []
    return [f"<h3>{escape(stage.slug)}: diagnosis</h3><ul class=diagnosis>{''.join(lines)}</ul>"]
