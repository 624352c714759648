"""Results for machines: JSON (versioned, schema in schema/results-v1.json), JUnit XML and
Gradescope's results.json. Pure functions of a RunResult; the terminal report is report.py."""

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from theinference.compare import Comparison
from theinference.results import CaseResult, RunResult, StageResult, Status

SCHEMA = "theinference.results/1"
SCHEMA_FILE = Path(__file__).with_name("schema") / "results-v1.json"


def to_json(run: RunResult) -> dict:
    return {
        "schema": SCHEMA,
        "passed": run.passed,
        "cancelled": run.cancelled,
        "sandbox": run.sandbox,
        "weights": {"label": run.weights_label, "sha256": run.weights_sha256},
        "environment": run.environment,
        "timings": timings(run),
        "stages": [stage_json(s) for s in run.stages],
    }


def timings(run: RunResult) -> dict:
    """Wall time split into the student's calls, the oracle, and the grader's own share."""
    student, oracle = run.student_seconds, run.oracle_seconds
    return {
        "total_seconds": round(run.seconds, 4),
        "student_seconds": round(student, 4),
        "oracle_seconds": round(oracle, 4),
        "grader_seconds": round(max(run.seconds - student - oracle, 0.0), 4),
        "worker_startups": run.worker_startups,
        "worker_startup_seconds": round(run.worker_startup_seconds, 4),
    }


def stage_json(stage: StageResult) -> dict:
    return {
        "slug": stage.slug,
        "title": stage.title,
        "status": stage.status.value,
        "reason": stage.reason,
        "seconds": round(stage.seconds, 4),
        "cases": [case_json(c) for c in stage.cases],
    }


def case_json(case: CaseResult) -> dict:
    return {
        "name": case.name,
        "status": case.status.value,
        "message": case.message,
        "hint": case.hint,
        "suspected_bug": case.suspected_bug,
        "fingerprinted": case.fingerprinted,
        "comparisons": [comparison_json(c) for c in case.comparisons],
        "steps": case.steps,
        "tokens": case.tokens,
        "traceback": case.traceback,
        "stdout": case.stdout,
        "stderr": case.stderr,
        "student_seconds": round(case.student_seconds, 4),
        "oracle_seconds": round(case.oracle_seconds, 4),
        "hidden": case.hidden,
    }


def comparison_json(c: Comparison) -> dict:
    return {
        "label": c.label,
        "shape": list(c.shape),
        "mismatched": c.mismatched,
        "total": c.total,
        "max_abs": c.max_abs,
        "max_abs_index": list(c.max_abs_index),
        "max_rel": c.max_rel,
        "max_rel_index": list(c.max_rel_index),
        "worst_tolerance_multiple": c.worst,
        "worst_index": list(c.worst_index),
        "atol": c.tolerance.atol,
        "rtol": c.tolerance.rtol,
        "argmax_actual": c.argmax_actual,
        "argmax_expected": c.argmax_expected,
        "noise_floor": c.noise,
        "noise_multiple": c.noise_multiple,
    }


def to_junit(run: RunResult) -> str:
    """One testsuite per stage, one testcase per case (a skipped stage: one skipped case)."""
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
        for case in cases:
            suite.append(junit_case(stage, case))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


def junit_case(stage: StageResult, case: CaseResult) -> ET.Element:
    el = ET.Element(
        "testcase",
        classname=stage.slug,
        name=case.name,
        time=f"{case.student_seconds + case.oracle_seconds:.3f}",
    )
    detail = "\n".join(x for x in (case.message, case.traceback, case.hint) if x)
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


def to_gradescope(run: RunResult) -> dict:
    """Gradescope's results.json (built in classroom/gradescope.py), scored by the stage specs."""
    from theinference.classroom.gradescope import gradescope_results
    from theinference.settings import Grading

    return gradescope_results(to_json(run), {s.slug: s.score_weight for s in run.stages}, Grading())


def write_atomically(path: Path, text: str) -> None:
    """A reader never sees half a results file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render(run: RunResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_json(run), indent=2)
    if fmt == "junit":
        return to_junit(run)
    if fmt == "gradescope":
        return json.dumps(to_gradescope(run), indent=2)
    raise ValueError(f"unknown format {fmt}")
