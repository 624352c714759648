"""The speed figure (grading/speed.py): the yardstick is the oracle's own cached generation
run as a course; only a submission whose generate loop passed in full gets a figure, any
other shows its status; Gradescope's leaderboard and the class report show it as [grading]
says, never in the score. The ranking itself (reference above a slower correct cache) is the
slow test here and benchmarks/speed_ranking.py's five runs under load."""

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from tests.helpers import make_course, reference_text
from tests.solutions.slow_cache import slow_cache_text
from theinference.classroom.report_sections import speed_section
from theinference.cli import app
from theinference.course.settings import Grading, SettingsError, parse_settings
from theinference.grading.speed import speed_after, speed_of, yardstick_course
from theinference.oracle import gpt2 as oracle
from theinference.output.formats import SCHEMA_FILE
from theinference.output.gradescope import gradescope_results
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.submission import Record
from theinference.student.process import StudentProcess
from theinference.student.sandbox import choose
from theinference.student.setup import Limits, ProcessSetup

runner = CliRunner()
GRADESCOPE_SCHEMA = json.loads(
    (SCHEMA_FILE.parent / "gradescope-results.json").read_text())
MEASURED = {"schema": "theinference.speed/1", "status": "measured", "ratio": 0.9,
            "tokens_ratio": 0.95, "tokens_per_cpu_second": 20.0, "decode_ms": 60.0,
            "oracle_tokens_per_cpu_second": 21.0, "oracle_decode_ms": 54.0,
            "workload": {"generate": [16, 32], "decode": [512, 32]}, "repeats": 3,
            "sandbox": "bwrap"}


def test_the_yardstick_is_the_oracles_cached_generation_in_the_sandbox(weights):
    """Would catch a yardstick that cannot import its copy of the oracle where the sandbox
    hides the grader, or that generates anything but the oracle's greedy tokens."""
    course = yardstick_course()
    try:
        with StudentProcess(ProcessSetup(course, weights.path, Limits(timeout=120),
                            sandbox=choose("auto"))) as process:
            outcome = process.call("run_generate", [[464, 2068, 7586], 6])
    finally:
        import shutil

        shutil.rmtree(course.parent, ignore_errors=True)
    assert outcome.kind == "returned", outcome.message + outcome.traceback
    w, layers = weights.tensors, weights.config.n_layer
    expected = oracle.greedy(oracle.forward([464, 2068, 7586], w, layers), 6, w, layers)
    assert [int(t) for t in outcome.value] == expected


def run_with(status: Status, partial: bool = False) -> RunResult:
    stage = StageResult("generate-loop", "The generate loop", status, partial=partial)
    return RunResult([stage], "synthetic", "0" * 64)


@pytest.mark.parametrize("status, partial, shown", [
    (Status.FAILED, False, "failed"), (Status.TIMEOUT, False, "timeout"),
    (Status.SKIPPED, False, "skipped"), (Status.PASSED, True, "partial")])
def test_no_pass_no_speed(status, partial, shown):
    """Would catch a speed figure for a submission whose generate loop failed, timed out,
    was skipped or ran only some cases (a failure must show its own status)."""
    speed = speed_after(run_with(status, partial), [], ProcessSetup(Path("."), Path(".")), None)
    assert speed["status"] == shown and "ratio" not in speed and "generate-loop" in speed["reason"]


def test_a_run_without_the_generate_loop_has_no_speed():
    """Would catch a figure made up for a run that never graded the generate loop."""
    result = RunResult([StageResult("build-prefill", "Prefill", Status.PASSED)], "s", "0" * 64)
    speed = speed_after(result, [], ProcessSetup(Path("."), Path(".")), None)
    assert speed["status"] == "not graded"


def results_with(speed: dict | None) -> RunResult:
    case = CaseResult(name="16 tokens", status=Status.PASSED)
    stage = StageResult("generate-loop", "The generate loop", Status.PASSED, cases=[case])
    return RunResult([stage], "synthetic", "0" * 64, seconds=3, speed=speed)


def test_the_leaderboard_is_posted_only_when_configured_and_measured():
    """Would catch a leaderboard posted against [grading], a speed posted for a submission
    without a figure, the speed changing the score, or fields Gradescope would refuse."""
    points = {"generate-loop": 2.0}
    board = gradescope_results(results_with(MEASURED), points, Grading(speed="leaderboard"))
    jsonschema.validate(board, GRADESCOPE_SCHEMA)
    assert board["leaderboard"][0] == {"name": "Speed (x the oracle's decode step)",
                                       "value": 0.9, "order": "desc"}
    quiet = gradescope_results(results_with(MEASURED), points, Grading(speed="report"))
    assert "leaderboard" not in quiet and quiet["score"] == board["score"] == 2.0
    failed = {"schema": "theinference.speed/1", "status": "failed", "reason": "..."}
    assert "leaderboard" not in gradescope_results(results_with(failed), points,
                                                   Grading(speed="leaderboard"))


def test_the_speed_setting_is_checked():
    """Would catch a typo in [grading] speed silently turning the figure off."""
    assert parse_settings({"grading": {"speed": "leaderboard"}}).grading.speed == "leaderboard"
    with pytest.raises(SettingsError, match="speed must be one of off, report, leaderboard"):
        parse_settings({"grading": {"speed": "fast"}})


def test_the_class_report_ranks_figures_and_shows_statuses():
    """Would catch the ranked table out of order, a failing or refused submission given a
    rank, or a section shown for a class graded without speed."""
    records = [
        Record("slow", "graded", results=results_with({**MEASURED, "ratio": 0.4})),
        Record("fast", "graded", results=results_with(MEASURED)),
        Record("broken", "graded", results=results_with({"status": "failed", "reason": "..."})),
        Record("refused", "rejected", results=None),
    ]
    html = speed_section(records)
    assert html.index("fast") < html.index("slow") < html.index("broken")
    assert "<td>1</td><td>fast</td><td>0.90x</td>" in html
    assert "<td>-</td><td>broken</td><td class=failed>failed</td>" in html
    assert "<td>-</td><td>refused</td><td class=rejected>rejected</td>" in html
    speed_off = Record("a", "graded", results=results_with(None))
    assert speed_section([speed_off]) == ""  # speed off


def test_a_partial_run_gets_no_speed_through_the_command_line(tmp_path, weights):
    """Would catch `test --speed` timing a run whose generate loop ran only some cases, or a
    JSON that leaves the speed or the provenance out or breaks its schema."""
    course = make_course(tmp_path / "course", reference_text())
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["test", "-C", str(course), "-s", "generate-loop", "--case",
                                 "one token, token id 0", "--speed", "--format", "json",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))
    assert data["speed"]["status"] == "partial" and "ratio" not in data["speed"]
    assert data["provenance"]["seed"] == "none"
    assert list(data["provenance"]["specs"]) == ["generate-loop"]


def test_made_up_tokens_earn_no_figure(tmp_path, weights):
    """Would catch a figure for a run_generate that answers the timed calls fast and wrong
    (the timed calls' tokens must be the oracle's)."""
    course = make_course(tmp_path / "course", reference_text())
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text() + "\n\ndef run_generate(prompt_ids, max_new_tokens):"
                        "\n    return [0] * max_new_tokens\n")
    setup = ProcessSetup(course, weights.path, Limits(timeout=300), sandbox=choose("auto"))
    speed = speed_of(setup, weights, repeats=1)
    assert speed["status"] == "unverified" and "ratio" not in speed, speed


@pytest.mark.slow
def test_the_reference_ranks_above_a_slower_correct_cache(tmp_path, weights):
    """Would catch a figure that cannot tell a cache that copies itself at every step from
    one that does not (benchmarks/speed_ranking.py repeats this under load)."""
    figures = {}
    for name, text in (("reference", reference_text()), ("slow", slow_cache_text())):
        course = make_course(tmp_path / name, text)
        setup = ProcessSetup(course, weights.path, Limits(timeout=300), sandbox=choose("auto"))
        # two turns each (the best of them): 2-3x apart, where one turn on a busy machine
        # once read the reference 2.7x slower than usual, the copying cache as fast as it
        figures[name] = speed_of(setup, weights, repeats=2)
        assert figures[name]["status"] == "measured", figures[name]
    assert figures["reference"]["ratio"] > figures["slow"]["ratio"]
    assert 0.5 < figures["reference"]["ratio"] < 2  # the reference is about the oracle's speed
