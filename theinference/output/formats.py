"""Results for machines: JSON (versioned, schema in schema/results-v3.json; written and read
back by results/json_form.py), JUnit XML and Gradescope's results.json (gradescope.py). Pure
functions of a RunResult and the course's [grading] settings; the terminal report is
report.py.

FORMATS is the one list of them: the command line derives its --format choices and its
--json/--junit/--gradescope file options from it, and `write` sends any of them anywhere."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.course.settings import Grading
from theinference.results import CaseResult, RunResult, StageResult, Status, where_text
from theinference.results.json_form import to_json
from theinference.results.text import inert_copy, no_surrogates, xml_text

WRITTEN_MODE = 0o644  # as a file made under the usual umask: a results file is for reading
SCHEMA_FILE = Path(__file__).with_name("schema") / "results-v3.json"


def to_junit(run: RunResult) -> str:
    """One testsuite per stage, one testcase per case (a skipped stage: one skipped case).
    Every string is made XML 1.0 text first: the student's output may hold any control."""
    run = inert_copy(run, xml_text)
    suites = ET.Element("testsuites", name="theinference", time=f"{run.seconds:.3f}")
    for stage in run.stages:
        cases = stage.cases or [
            CaseResult(name=stage.slug, status=stage.status, message=stage.reason)
        ]
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=stage.slug,
            tests=str(len(cases)),
            failures=str(sum(c.status in (Status.FAILED, Status.TODO) for c in cases)),
            errors=str(sum(c.status in (Status.ERROR, Status.TIMEOUT) for c in cases)),
            skipped=str(sum(c.status == Status.SKIPPED for c in cases)),
            time=f"{stage.seconds:.3f}",
        )
        suite.append(junit_properties(stage, run))
        for case in cases:
            suite.append(junit_case(stage, case))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


def junit_properties(stage: StageResult, run: RunResult) -> ET.Element:
    """The stage's diagnosis, whether its verdict rests on some of its cases only, and the
    sandbox the run had (with its notes)."""
    props = ET.Element("properties")
    for name, value in (
        ("sandbox", run.sandbox),
        ("sandbox_notes", "; ".join(run.notes)),
        ("suspected_bug", stage.suspected_bug or ""),
        ("candidates", ",".join(stage.candidates)),
        ("bug_name", stage.bug_name),
        ("hint", stage.hint),
        ("lesson", stage.lesson or ""),
        ("where", where_text(stage.where)),
        ("first_case", stage.first_case or ""),
        ("worst_case", stage.worst_case or ""),
        ("shared_error", str(stage.shared_error).lower()),
        ("partial", str(stage.partial).lower()),
        ("not_run", str(len(stage.not_run))),
    ):
        ET.SubElement(props, "property", name=name, value=value)
    return props


def junit_case(stage: StageResult, case: CaseResult) -> ET.Element:
    el = ET.Element(
        "testcase",
        classname=stage.slug,
        name=case.name,
        time=f"{case.student_seconds + case.oracle_seconds:.3f}",
    )
    diagnosis = diagnosis_text(stage) if case.status in (Status.FAILED, Status.ERROR) else ""
    own_hint = "" if stage.speaks_for(case) else case.hint
    detail = "\n".join(x for x in (case.message, case.traceback, own_hint, diagnosis) if x)
    tag = {
        Status.FAILED: "failure",
        Status.TODO: "failure",
        Status.ERROR: "error",
        Status.TIMEOUT: "error",
        Status.SKIPPED: "skipped",
    }.get(case.status)
    if tag:
        child = ET.SubElement(el, tag, message=f"{case.status.value}: {case.message}"[:500])
        child.text = detail
    if case.stdout:
        ET.SubElement(el, "system-out").text = case.stdout
    if case.stderr:
        ET.SubElement(el, "system-err").text = case.stderr
    return el


def diagnosis_text(stage: StageResult) -> str:
    """The stage's diagnosis as the terminal says it: the suspected bug, then the hint."""
    lines = [f"suspected bug: {stage.bug_name}"] if stage.bug_name else []
    return "\n".join(lines + ([f"hint: {stage.hint}"] if stage.hint else []))


def to_gradescope(run: RunResult, grading: Grading) -> dict:
    """Gradescope's results.json (gradescope.py), scored as the course's [grading] says."""
    from theinference.grading.scores import stage_points
    from theinference.output.gradescope import gradescope_results

    # the student's text as JSON keeps it: raw, less lone surrogates
    clean = inert_copy(run, no_surrogates)
    return gradescope_results(clean, stage_points(run.stages, grading), grading)


def to_html(run: RunResult) -> str:
    """The run as a standalone page (html_page.py), its error maps drawn."""
    from theinference.output.html_page import page  # rich, only when a page is asked for

    return page(run)


@dataclass(frozen=True)
class Format:
    name: str  # --format NAME; also --NAME FILE (junit: --junit FILE)
    render: Callable[[RunResult, Grading], str]
    suffix: str  # the usual file name ending
    help: str


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("json", lambda run, _: json.dumps(to_json(run), indent=2), ".json", "JSON results"),
        Format("junit", lambda run, _: to_junit(run), ".xml", "JUnit XML"),
        Format("html", lambda run, _: to_html(run), ".html", "a standalone HTML page"),
        Format(
            "gradescope",
            lambda run, grading: json.dumps(to_gradescope(run, grading), indent=2),
            ".json",
            "Gradescope results.json",
        ),
    )
}


def render(run: RunResult, fmt: str, grading: Grading | None = None) -> str:
    return FORMATS[fmt].render(run, grading or Grading())


def write(run: RunResult, fmt: str, path: Path | None, grading: Grading | None = None) -> None:
    """One format to a file (replaced atomically) or, with no path, to stdout; `grading` is
    the course's [grading] (Gradescope's scores and visibility)."""
    text = render(run, fmt, grading) + "\n"
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write(path, text, mode=WRITTEN_MODE)


def writer(outputs: list, grading: Grading) -> Callable[[RunResult], None]:
    """What writes a session's outputs (grading/session.py's Output: format and path) after
    each run, Gradescope's scored as the course's [grading] says."""

    def write_all(run: RunResult) -> None:
        for out in outputs:
            write(run, out.format, out.path, grading)

    return write_all
