"""One result model: every reader of results takes a RunResult, read back from the JSON the
grader writes by the one reader (results/json_form.py; a class record's by
results/submission.py). The round trip RunResult -> JSON -> RunResult is exact for every field
the JSON carries; malformed, foreign or forged JSON is a ResultsError that says where, never a
traceback; the classroom reads the results the grader wrote, never a file the student did;
and no module but the readers indexes a run's JSON."""

import ast
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import theinference
from theinference.classroom import batch
from theinference.classroom.batch import Plan
from theinference.cli import app
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.compare import Tolerance, compare
from theinference.results.error_map import error_map, numbered
from theinference.results.json_form import from_json, read_run, to_json
from theinference.results.reading import ResultsError
from theinference.results.submission import Record, StageRow, record_from_json, record_json

PACKAGE = Path(theinference.__file__).parent
TOL = Tolerance(atol=1e-4, rtol=1e-3)


def failing_case() -> CaseResult:
    """A failed case carrying every figure: comparisons (noise floor, argmax), where it
    departs, its error map, per-step errors, the suspected bug and an error lesson."""
    expected = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 12)
    actual = expected.copy()
    actual[1, 5:] += 0.5
    logits = compare("logits", actual, expected, TOL, logits=True)
    ratio = np.abs(actual - expected) / (TOL.atol + TOL.rtol * np.abs(expected))
    grid = error_map(ratio, ("layer", numbered(2)), ("position", numbered(12)))
    return CaseResult(
        name="two tokens", status=Status.FAILED, message="K departs at layer 1",
        hint="append K/V first", comparisons=[replace(logits, noise=2.5e-7)],
        steps=[0.25, 812.5], suspected_bug="attend-old-length", lesson=None,
        where={"layer": 1, "tensor": "K", "position": 5}, error_map=grid,
        stdout="printed\n", stderr="warned\n", student_seconds=0.1234, oracle_seconds=0.5,
    )


def generated_case() -> CaseResult:
    tokens = {"yours": [5, 6, 7], "expected": [5, 6, 8], "first_divergence": 2,
              "near_ties": []}
    return CaseResult(name="3 tokens", status=Status.FAILED, message="token 2 departs",
                      tokens=tokens, where={"token": 2})


def run_of_every_kind() -> RunResult:
    """A failing stage, a crashed and timed-out one, a partial one, a skipped one."""
    crashed = CaseResult(
        name="short prompt", status=Status.ERROR, message="NameError: name 'cahce'",
        traceback='File "src/kvcache.py", line 3\nNameError', lesson="misspelt-name",
        stderr="\x1b[2Kboom", student_seconds=0.01)
    timed_out = CaseResult(name="long prompt", status=Status.TIMEOUT, message="over 60 s",
                           hidden=True, student_seconds=60.0)
    return RunResult(
        stages=[
            StageResult("single-step-attention", "Attention", Status.FAILED,
                        cases=[CaseResult(name="one token", status=Status.PASSED),
                               failing_case()],
                        seconds=1.5, suspected_bug="attend-old-length",
                        candidates=["attend-old-length", "no-append"],
                        bug_name="attends over the old length", hint="append K/V first",
                        where={"layer": 1}, first_case="two tokens", worst_case="two tokens",
                        diagnosed=True),
            StageResult("build-prefill", "Prefill", Status.ERROR, cases=[crashed, timed_out],
                        seconds=61.25, lesson="misspelt-name", shared_error=False,
                        bug_name="a misspelt name"),
            StageResult("generate-loop", "Generate", Status.FAILED, cases=[generated_case()],
                        partial=True, not_run=["32 tokens", "hidden case 1"]),
            StageResult("prefix-caching", "Prefix", Status.SKIPPED,
                        reason="build-prefill did not pass"),
        ],
        weights_label="synthetic (ad77915c57eb)", weights_sha256="a" * 64, seconds=70.5,
        worker_startups=2, worker_startup_seconds=0.75,
        environment={"theinference": "1.0", "python": "3.11", "numpy": "2", "blas": "x",
                     "platform": "linux"},
        notes=["the sandbox is none: run as root for a stronger one"], sandbox="none",
        cpu_account="seccomp", provenance={"theinference": "1.0", "specs": {"a": "0" * 16}},
        speed={"schema": "theinference.speed/1", "status": "failed", "reason": "it failed"},
    )


def test_a_run_of_every_kind_reads_back_exactly():
    """Catches a field the JSON carries lost or changed on the way back (a comparison's
    noise floor, a case's error map, tokens, a stage's diagnosis, a crash's traceback, a
    partial stage's cases not run, the run's sandbox and notes)."""
    run = run_of_every_kind()
    text = json.dumps(to_json(run), indent=2)
    assert read_run(text) == run
    assert read_run(text.encode()) == run
    assert to_json(read_run(text)) == to_json(run)  # and written again, the same JSON


def test_a_cancelled_run_and_one_without_speed_read_back_exactly():
    """Catches the reader inventing a speed figure where none was written, or losing that a
    watch-mode run was cancelled (its results incomplete)."""
    run = replace(run_of_every_kind(), speed=None, cancelled=True, provenance={})
    assert from_json(json.loads(json.dumps(to_json(run)))) == run


def written() -> dict:
    return json.loads(json.dumps(to_json(run_of_every_kind())))


def forged(change) -> dict:
    data = written()
    change(data)
    return data


HOSTILE = {
    "another version's": (forged(lambda d: d.update(schema="theinference.results/2")),
                          "schema is not theinference.results/3"),
    "not an object": ([], "results must be an object, not a list"),
    "an unknown status": (forged(lambda d: d["stages"][0].update(status="great")),
                          "results.stages[0]: status must be one of passed"),
    "a number for a message": (
        forged(lambda d: d["stages"][1]["cases"][0].update(message=5)),
        "results.stages[1].cases[0]: message must be a string, not a number"),
    "true for seconds": (forged(lambda d: d["timings"].update(total_seconds=True)),
                         "results.timings: total_seconds must be a number, not true or false"),
    "a stage without cases": (forged(lambda d: d["stages"][3].pop("cases")),
                              "results.stages[3]: cases is missing"),
    "passed claimed over failing stages": (forged(lambda d: d.update(passed=True)),
                                           "passed or partial disagrees"),
    "an error map departing outside its grid": (
        forged(lambda d: d["stages"][0]["cases"][1]["error_map"].update(first=[99, 0])),
        "error_map: its labels, cells and first departure disagree"),
    "a speed ratio without its figures": (
        forged(lambda d: d.update(speed={"schema": "theinference.speed/1",
                                         "status": "measured", "ratio": 2.0})),
        "results.speed: tokens_per_cpu_second is missing"),
    "a comparison's shape of strings": (
        forged(lambda d: d["stages"][0]["cases"][1]["comparisons"][0].update(shape=["a"])),
        "comparisons[0]: shape must be a list, each a whole number"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_results_are_refused_saying_where(name):
    """Catches results that are not the grader's (forged, damaged, another version's) read as
    if they were, or refused with a KeyError or TypeError from deep inside a reader."""
    data, said = HOSTILE[name]
    with pytest.raises(ResultsError, match=re.escape(said)):
        from_json(data)


@pytest.mark.parametrize("text", ["{", "[" * 100_000, b'{"a": "\xc3\x28"}', "9" * 5000])
def test_text_that_is_not_json_is_refused(text):
    """Catches unparseable results (truncated, nested past the parser, not UTF-8) escaping as
    a RecursionError or a decode error instead of a ResultsError."""
    with pytest.raises(ResultsError):
        read_run(text)


# --- a class's record, and the summary command --------------------------------------------


def test_a_record_reads_back_exactly_with_its_run():
    """Catches a class record's field (its rows, job share, code, or the run inside it) lost
    on the way through its file."""
    record = Record("ann", "graded", "", 1.5, 3.0,
                    rows=[StageRow("single-step-attention", "failed", 1.5, 3.0, "x", 812.5, 1, 2)],
                    source="ann.zip", language="python", content_sha256="c" * 64,
                    plan_key="p" * 64, seconds=12.3, provenance={"seed": "none"},
                    code={"src/kvcache.py": "pass\n"}, sandbox="bwrap", cpu_account="cgroup-v2",
                    sandbox_notes=["note"], allocation={"jobs": 1}, results=run_of_every_kind())
    assert record_from_json(json.loads(json.dumps(record_json(record)))) == record


def test_the_summary_command_refuses_forged_results_without_a_traceback(tmp_path):
    """Catches `theinference summary` tracing back on a results file that is not the
    grader's (a CI job summary made from whatever the repository holds)."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(forged(lambda d: d["stages"][0].update(status="great"))))
    result = CliRunner().invoke(app, ["summary", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "results.stages[0]: status must be one of" in result.output
    path.write_text(json.dumps(written()))
    shown = CliRunner().invoke(app, ["summary", str(path)])
    assert shown.exit_code == 0 and "| build-prefill | error | 0/2 |" in shown.output


# --- the classroom reads what the grader wrote --------------------------------------------------


def graded_with(monkeypatch, writes: str | None) -> tuple:
    """run_test on a submission holding a forged results.json, the grader's run replaced by
    one that exits 0 having written `writes` (None: nothing) to its output."""
    passing = json.dumps(to_json(replace(run_of_every_kind(), stages=[])))

    def grader(cmd, *args, **kwargs):
        if writes is not None:
            Path(cmd[cmd.index("--output") + 1]).write_text(writes)
        return 0

    monkeypatch.setattr(batch, "run_bounded", grader)
    files = {name: passing.encode() for name in ("results.json", "src/results.json")}
    files["kvcache.py"] = b"pass\n"
    return batch.run_test(files, Plan(weights="synthetic", points={}), jobs=1)


def test_a_results_file_in_the_submission_is_never_read(monkeypatch):
    """Catches the classroom taking a results.json the student submitted (here a passing one)
    as the grader's: a grader that wrote nothing leaves the submission ungraded."""
    status, message, run = graded_with(monkeypatch, None)
    assert (status, run) == ("grader-error", None), message


def test_unreadable_results_are_the_graders_error_saying_where(monkeypatch):
    """Catches results the grader's output file holds but are not the grader's (damaged, or
    written by the student's process beside the course) graded, or tracing back."""
    bad = json.dumps(forged(lambda d: d["stages"][2].update(partial="yes")))
    status, message, run = graded_with(monkeypatch, bad)
    assert (status, run) == ("grader-error", None)
    assert message.startswith("unreadable results: results.stages[2]: partial must be")
    status, _, run = graded_with(monkeypatch, json.dumps(written()))
    assert status == "graded" and run == run_of_every_kind()


# --- no module but the readers indexes a run's JSON -------------------------------------------

READERS = {PACKAGE / "results" / "json_form.py", PACKAGE / "results" / "submission.py"}
RUN_KEYS = {"stages", "cases", "comparisons", "timings", "worst_tolerance_multiple", "results"}
# other files' own keys of the same name, each read where its file is
OTHER_FORMATS = {
    "course/settings.py": {"stages"},  # [grading] stages in theinference.toml
    "curriculum/stages.py": {"cases"},  # a stage spec's cases (specs/*.toml)
    "grading/progress.py": {"stages"},  # the course's progress file, not a run
}


def run_json_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every `x["stages"]`-style read and `x.get("stages")` of a run's key."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):
            key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in RUN_KEYS:
            found.append((node.lineno, key.value))
    return found


def test_no_module_but_the_readers_indexes_a_runs_json():
    """Catches a reader of results (Gradescope, the gradebook, the class report, a regrade,
    a command) indexing a run's JSON dict again instead of taking the RunResult (or Record)
    the one reader makes: its checks, and its errors that say where, would not apply."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE).as_posix()
        allowed = OTHER_FORMATS.get(name, set())
        reads = [(line, key) for line, key in run_json_reads(path.read_text())
                 if key not in allowed]
        if path not in READERS and reads:
            found[name] = reads
    assert not found, found


@pytest.mark.parametrize("planted", [
    'rows = record["stages"]\n',
    'cases = stage.get("cases", [])\n',
    'worst = max(c["worst_tolerance_multiple"] for c in x)\n',
    'spent = (record.get("results") or {})\n',
    'total = data["timings"]["total_seconds"]\n',
])
def test_the_scan_catches_a_planted_read(planted):
    """Catches the scan above going blind (it would then pass whatever the package does)."""
    assert run_json_reads(planted) and run_json_reads(planted)[0][0] == 1


def test_a_comparison_is_numpys_allclose_rule_and_leaves_both_arrays_as_they_were():
    """Catches the in-place work of `compare` reaching the arrays it was given (the student's
    answer or the oracle's kept one changed for the next reader), and a count, worst case or
    place that departs from |a - e| <= atol + rtol |e| worked out in float64."""
    rng = np.random.default_rng(7)
    expected = rng.standard_normal((4, 50)).astype(np.float32)
    actual = (expected + rng.standard_normal((4, 50)) * 2e-3).astype(np.float64)
    kept = (actual.copy(), expected.copy())
    c = compare("logits", actual, expected, TOL, logits=True)
    assert np.array_equal(actual, kept[0]) and np.array_equal(expected, kept[1])
    diff = np.abs(actual - expected.astype(np.float64))
    allowed = TOL.atol + TOL.rtol * np.abs(expected.astype(np.float64))
    assert c.mismatched == int((diff > allowed).sum()) > 0
    assert c.worst == float((diff / allowed).max()) and c.max_abs == float(diff.max())
    assert c.worst_index == np.unravel_index((diff / allowed).argmax(), expected.shape)
    assert c.argmax_actual == int(actual[-1].argmax())
