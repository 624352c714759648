"""Gradescope's results.json from the run `theinference test` graded (a RunResult; the
autograder reads it back from the run's JSON): a test per stage (and one for its seeded hidden
cases, shown after publication), scored and shown as the course's [grading] says, each
carrying the diagnosis in markdown: status, suspected bug, error lesson and hint, where it
departs, the allclose figures, the student's trimmed traceback, captured output (capped).
The one rendering: `test --format gradescope` and `gradescope run` both call
`gradescope_results`. Every piece of text is made inert markdown (results/text.py): the
student's cannot render as ours.

Field names and values follow Gradescope's autograder specification; schema/gradescope-
results.json holds them, and the tests validate every results.json against it.
"""

from theinference.course.settings import Grading
from theinference.grading.scores import CaseGroup, first_suspected_bug, scored_groups
from theinference.results import CaseResult, RunResult, StageResult, Status, where_text
from theinference.results.json_form import SCHEMA
from theinference.results.text import markdown_fence, markdown_text

TRACEBACK_LINES = 30
OUTPUT_CHARS = 2000
MESSAGE_CHARS = 600


def gradescope_results(run: RunResult, points: dict[str, float], grading: Grading) -> dict:
    """points: slug -> max score."""
    tests = []
    for stage in run.stages:
        for group in scored_groups(stage, points.get(stage.slug, 1.0), grading):
            tests.append(stage_test(stage, group, grading, len(tests) + 1))
    score = round(sum(t["score"] for t in tests), 4)
    board = leaderboard(run.speed) if grading.speed == "leaderboard" else []
    return {
        **({"leaderboard": board} if board else {}),
        "score": score,
        "execution_time": int(round(run.seconds)),
        "output": summary(run, tests),
        "output_format": "md",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "extra_data": {
            "weights": {"label": run.weights_label, "sha256": run.weights_sha256},
            "schema": SCHEMA,
            "provenance": run.provenance,
            "sandbox": run.sandbox,
            "cpu_account": run.cpu_account,
            "notes": run.notes,
        },
        "tests": tests,
    }


def leaderboard(speed: dict | None) -> list[dict]:
    """Gradescope's leaderboard from the speed figure (grading/speed.py); a submission
    without a figure posts nothing, never a speed it did not earn. Never part of the score."""
    if not speed or speed.get("status") != "measured" or speed.get("ratio") is None:
        return []
    return [
        {"name": "Speed (x the oracle's decode step)", "value": speed["ratio"], "order": "desc"},
        {"name": "Tokens per CPU second", "value": speed["tokens_per_cpu_second"],
         "order": "desc"},
        {"name": "Decode step (ms of CPU)", "value": speed["decode_ms"], "order": "asc"},
    ]


def stage_test(stage: StageResult, group: CaseGroup, grading: Grading, number: int) -> dict:
    hidden = group.hidden
    name = f"{stage.slug}: {stage.title}" + (" (hidden cases)" if hidden else "")
    return {
        "name": name,
        "number": str(number),
        "score": group.score,
        "max_score": round(group.points, 4),
        "status": "passed" if group.full_marks else "failed",
        "output": ("**partial run: cases were left out, no score**\n\n" if stage.partial else "")
        + stage_markdown(stage, group),
        "output_format": "md",
        "tags": [stage.slug, *(["hidden"] if hidden else [])],
        "visibility": grading.hidden_visibility if hidden else grading.visibility_of(stage.slug),
    }


def stage_markdown(stage: StageResult, group: CaseGroup) -> str:
    cases = group.cases
    passed = sum(c.status == Status.PASSED for c in cases)
    lines = [f"**Status: {group.status}**, {passed} of {len(cases)} cases passed"]
    if stage.reason:
        lines.append(f"\n{markdown_text(stage.reason)}")
    if group.status != Status.PASSED:
        lines += diagnosis_markdown(stage, group)
    if cases:
        lines += ["", "| case | status | worst error (× tolerance) | mismatched |",
                  "|---|---|---|---|"]
        lines += [case_row(c) for c in cases]
    for case in cases:
        if case.status != Status.PASSED:
            lines += case_detail(case)
    return "\n".join(lines)


def diagnosis_markdown(stage: StageResult, group: CaseGroup) -> list[str]:
    """The stage's diagnosis as the terminal gives it: the suspected bug (or the error's lesson)
    in words, where it departs, the hint. A hidden group shows only what its own cases say."""
    cases = group.cases
    said = None if group.hidden else stage
    bug = first_suspected_bug(said and said.suspected_bug, cases)
    name, lesson = (said.bug_name, said.lesson) if said else ("", None)
    lines = []
    if bug or name:
        tag = f"`{bug}`" if bug else f"`{lesson}`" if lesson else ""  # the table's ids
        named = ": ".join(x for x in (tag, name) if x)  # the bug table's words, not the student's
        lines.append(f"\n**Suspected bug:** {named}")
    if lesson:
        lines.append(f"\n**Error lesson:** `{lesson}`")
    if said and said.where:
        lines.append(f"\n**First departs at:** {where_text(said.where)}")
    hint = (said and said.hint) or next((c.hint for c in cases if c.hint), "")
    if hint:
        lines.append(f"\n**Hint:** {hint}")  # the checks' and the bug table's words
    return lines


def case_row(case: CaseResult) -> str:
    mismatched = sum(c.mismatched for c in case.comparisons)
    total = sum(c.total for c in case.comparisons)
    figure = "" if case.worst is None else f"{case.worst:.3g}"
    count = f"{mismatched} of {total}" if total else ""
    return f"| {markdown_text(case.name)} | {case.status} | {figure} | {count} |"


def case_detail(case: CaseResult) -> list[str]:
    lines = [f"\n#### {markdown_text(case.name)}: {case.status}", "",
             markdown_text(_clip(case.message, MESSAGE_CHARS))]
    for cmp in case.comparisons:
        if cmp.mismatched:
            lines.append(  # indices as lists, as the JSON has them
                f"\n- {cmp.label} {list(cmp.shape)}: {cmp.mismatched} of {cmp.total} "
                f"outside atol {cmp.tolerance.atol:g} + rtol {cmp.tolerance.rtol:g}; max abs "
                f"{cmp.max_abs:.3g} at {list(cmp.max_abs_index)}; worst "
                f"{cmp.worst:.3g}× the tolerance at {list(cmp.worst_index)}"
            )
    if case.traceback:
        lines += ["", "Traceback (your code):", markdown_fence(trim_traceback(case.traceback))]
    for stream, text in (("stdout", case.stdout), ("stderr", case.stderr)):
        if text:
            lines += ["", f"Your {stream}:", markdown_fence(_clip(text, OUTPUT_CHARS))]
    return lines


def trim_traceback(text: str) -> str:
    """The last frames are the student's: keep those, say how much went."""
    lines = text.rstrip().splitlines()
    if len(lines) <= TRACEBACK_LINES:
        return "\n".join(lines)
    return f"[... {len(lines) - TRACEBACK_LINES} lines]\n" + "\n".join(lines[-TRACEBACK_LINES:])


def summary(run: RunResult, tests: list[dict]) -> str:
    total = sum(t["max_score"] for t in tests)
    score = sum(t["score"] for t in tests)
    passed = sum(s.status == Status.PASSED for s in run.stages)
    return (f"**{score:g} of {total:g} points**: {passed} of {len(run.stages)} stages passed "
            f"(weights {markdown_text(run.weights_label)}). Run "
            "`theinference test --stage SLUG` in your course for the full report. "
            f"Sandbox: {markdown_text(run.sandbox)}.")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... cut at {limit} characters]"


def failure_results(message: str) -> dict:
    """results.json for a submission that could not be graded: no points, and why."""
    return {"score": 0.0, "output": markdown_text(message), "output_format": "md",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": []}
