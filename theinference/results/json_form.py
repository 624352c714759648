"""The results as JSON (versioned; its schema is output/schema/results-v3.json): `to_json`
writes a RunResult, `read_run` and `from_json` read one back, field for field. The one place a
run's JSON is indexed: every other reader (Gradescope, the gradebook, the class report, a
regrade, `summary`) takes the RunResult this gives.

A file is read as untrusted: it may be damaged, another version's, or forged. Each field is
checked as it is taken (reading.py), and what the grader derives (passed, partial) must agree
with the stages it carries; anything else is a ResultsError that says where."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.reading import (
    FLAG,
    NUMBER,
    OBJECT,
    TEXT,
    WHOLE,
    Fields,
    ResultsError,
    either,
    list_of,
    mapping_of,
    one_of,
    or_null,
)
from theinference.results.text import inert_copy, no_surrogates

if TYPE_CHECKING:  # NumPy stays out of the command line's start-up
    from theinference.results.compare import Comparison

SCHEMA = "theinference.results/3"
STATUS = one_of([s.value for s in Status])
WHERE = or_null(mapping_of(either(WHOLE, TEXT)))
NAME = or_null(TEXT)
INDEX = list_of(WHOLE)


def to_json(run: RunResult) -> dict:
    # the student's text stays as written (JSON escapes every control), less lone surrogates
    return inert_copy({
        "schema": SCHEMA,
        "passed": run.passed,
        "partial": run.partial,
        "cancelled": run.cancelled,
        "sandbox": run.sandbox,
        "cpu_account": run.cpu_account,  # what counted the student's CPU (student/account.py)
        "notes": list(run.notes),  # the sandbox's and the weights' (e.g. how to do better)
        "weights": {"label": run.weights_label, "sha256": run.weights_sha256},
        "environment": run.environment,
        "timings": timings(run),
        "stages": [stage_json(s) for s in run.stages],
        "provenance": run.provenance,
        **({"speed": run.speed} if run.speed is not None else {}),
    }, no_surrogates)


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
        "partial": stage.partial,
        "not_run": list(stage.not_run),
        "suspected_bug": stage.suspected_bug,
        "candidates": list(stage.candidates),
        "bug_name": stage.bug_name,
        "hint": stage.hint,
        "lesson": stage.lesson,
        "where": stage.where,
        "first_case": stage.first_case,
        "worst_case": stage.worst_case,
        "shared_error": stage.shared_error,
        "diagnosed": stage.diagnosed,
        "cases": [case_json(c) for c in stage.cases],
    }


def case_json(case: CaseResult) -> dict:
    return {
        "name": case.name,
        "hidden": case.hidden,
        "status": case.status.value,
        "message": case.message,
        "hint": case.hint,
        "suspected_bug": case.suspected_bug,
        "lesson": case.lesson,
        "where": case.where,
        "error_map": case.error_map,
        "comparisons": [comparison_json(c) for c in case.comparisons],
        "steps": case.steps,
        "tokens": case.tokens,
        "traceback": case.traceback,
        "stdout": case.stdout,
        "stderr": case.stderr,
        "student_seconds": round(case.student_seconds, 4),
        "oracle_seconds": round(case.oracle_seconds, 4),
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


# --- read back ---------------------------------------------------------------------------------


def read_run(text: str | bytes) -> RunResult:
    """The run a results file holds (`test --format json`); ResultsError when it is not JSON,
    is another version's, or is not what the grader writes."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser
        raise ResultsError(f"results are not JSON: {exc}") from None
    return from_json(data)


def from_json(data: object) -> RunResult:
    """The RunResult `to_json` wrote, every field it carries as it was."""
    run = Fields(data, "results")
    if run.get("schema", TEXT) != SCHEMA:  # its text is never echoed: it may be anyone's
        raise ResultsError(f"results: schema is not {SCHEMA} (another version wrote them)")
    weights, timed = run.object("weights"), run.object("timings")
    result = RunResult(
        stages=[stage_from(s) for s in run.objects("stages")],
        weights_label=weights.get("label", TEXT),
        weights_sha256=weights.get("sha256", TEXT),
        seconds=timed.get("total_seconds", NUMBER),
        worker_startups=timed.get("worker_startups", WHOLE),
        worker_startup_seconds=timed.get("worker_startup_seconds", NUMBER, 0.0),
        cancelled=run.get("cancelled", FLAG),
        environment=run.get("environment", mapping_of(TEXT)),
        notes=list(run.get("notes", list_of(TEXT), [])),
        sandbox=run.get("sandbox", TEXT),
        cpu_account=run.get("cpu_account", TEXT, "none"),
        provenance=run.get("provenance", OBJECT, {}),
        speed=speed_from(run),
    )
    if (run.get("passed", FLAG), run.get("partial", FLAG)) != (result.passed, result.partial):
        raise ResultsError("results: passed or partial disagrees with the stages they hold")
    return result


def stage_from(s: Fields) -> StageResult:
    return StageResult(
        slug=s.get("slug", TEXT),
        title=s.get("title", TEXT),
        status=Status(s.get("status", STATUS)),
        cases=[case_from(c) for c in s.objects("cases")],
        reason=s.get("reason", TEXT),
        seconds=s.get("seconds", NUMBER),
        partial=s.get("partial", FLAG),
        not_run=list(s.get("not_run", list_of(TEXT))),
        suspected_bug=s.get("suspected_bug", NAME),
        candidates=list(s.get("candidates", list_of(TEXT))),
        bug_name=s.get("bug_name", TEXT),
        hint=s.get("hint", TEXT),
        lesson=s.get("lesson", NAME),
        where=s.get("where", WHERE),
        first_case=s.get("first_case", NAME),
        worst_case=s.get("worst_case", NAME),
        shared_error=s.get("shared_error", FLAG),
        diagnosed=s.get("diagnosed", FLAG),
    )


def case_from(c: Fields) -> CaseResult:
    return CaseResult(
        name=c.get("name", TEXT),
        hidden=c.get("hidden", FLAG),
        status=Status(c.get("status", STATUS)),
        message=c.get("message", TEXT),
        hint=c.get("hint", TEXT),
        suspected_bug=c.get("suspected_bug", NAME),
        lesson=c.get("lesson", NAME),
        where=c.get("where", WHERE),
        error_map=error_map_from(c),
        comparisons=[comparison_from(x) for x in c.objects("comparisons")],
        steps=c.get("steps", or_null(list_of(NUMBER)), None),
        tokens=tokens_from(c),
        traceback=c.get("traceback", TEXT),
        stdout=c.get("stdout", TEXT),
        stderr=c.get("stderr", TEXT),
        student_seconds=c.get("student_seconds", NUMBER),
        oracle_seconds=c.get("oracle_seconds", NUMBER),
    )


def comparison_from(x: Fields) -> Comparison:
    from theinference.results.compare import Comparison, Tolerance  # NumPy: only once read

    return Comparison(
        label=x.get("label", TEXT),
        shape=tuple(x.get("shape", INDEX)),
        mismatched=x.get("mismatched", WHOLE),
        total=x.get("total", WHOLE),
        max_abs=x.get("max_abs", NUMBER),
        max_abs_index=tuple(x.get("max_abs_index", INDEX, [])),
        max_rel=x.get("max_rel", NUMBER),
        max_rel_index=tuple(x.get("max_rel_index", INDEX, [])),
        worst=x.get("worst_tolerance_multiple", NUMBER),
        worst_index=tuple(x.get("worst_index", INDEX, [])),
        tolerance=Tolerance(x.get("atol", NUMBER), x.get("rtol", NUMBER)),
        argmax_actual=x.get("argmax_actual", or_null(WHOLE), None),
        argmax_expected=x.get("argmax_expected", or_null(WHOLE), None),
        noise=x.get("noise_floor", or_null(NUMBER), None),
    )


def error_map_from(case: Fields) -> dict | None:
    """The case's error map (results/error_map.py): a label per row and column, a cell for
    each pair of them, its first departure inside the grid."""
    if case.get("error_map", or_null(OBJECT), None) is None:
        return None
    grid = case.object("error_map")
    rows, columns = (axis_labels(grid.object(axis)) for axis in ("rows", "columns"))
    cells = grid.get("cells", list_of(list_of(NUMBER)))
    first = grid.get("first", INDEX)
    grid.get("first_at", mapping_of(TEXT))
    whole = len(cells) == len(rows) and all(len(line) == len(columns) for line in cells)
    inside = len(first) == 2 and 0 <= first[0] < len(rows) and 0 <= first[1] < len(columns)
    if not (whole and inside):
        raise ResultsError(f"{grid.where}: its labels, cells and first departure disagree")
    return grid.data


def axis_labels(axis: Fields) -> list[str]:
    axis.get("name", TEXT)
    return axis.get("labels", list_of(TEXT))


def tokens_from(case: Fields) -> dict | None:
    """generate-loop's tokens: the student's, the recompute's, where they first part."""
    if case.get("tokens", or_null(OBJECT), None) is None:
        return None
    tokens = case.object("tokens")
    for key in ("yours", "expected"):
        tokens.get(key, INDEX)
    tokens.get("first_divergence", or_null(WHOLE))
    tokens.get("near_ties", INDEX, [])
    return tokens.data


SPEED_FIGURES = ("tokens_ratio", "tokens_per_cpu_second", "decode_ms",
                 "oracle_tokens_per_cpu_second", "oracle_decode_ms")


def speed_from(run: Fields) -> dict | None:
    """The speed figure (grading/speed.py): a measured ratio comes with the figures shown
    beside it (the class report's ranking, Gradescope's leaderboard)."""
    if run.get("speed", OBJECT, None) is None:
        return None
    speed = run.object("speed")
    speed.get("reason", TEXT, "")
    for key in SPEED_FIGURES:
        speed.get(key, NUMBER, None)
    ratio = speed.get("ratio", or_null(NUMBER), None)
    if speed.get("status", TEXT) == "measured" and ratio is not None:
        speed.get("tokens_per_cpu_second", NUMBER)
        speed.get("decode_ms", NUMBER)
    return speed.data
