"""GitHub Actions workflows: the class matrix (the worked example of --shard) and the student's
grade-on-push workflow with its job-summary stage table."""

import json

import yaml
from typer.testing import CliRunner

from theinference import __version__
from theinference.cli import app

runner = CliRunner()


def test_the_matrix_workflow_shards_then_merges(tmp_path):
    """Would catch a matrix that misses a shard, a shard count out of step with --shard, or a
    workflow GitHub could not parse."""
    out = tmp_path / "grade-class.yml"
    result = runner.invoke(app, ["workflow", "matrix", "--shards", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    flow = yaml.safe_load(out.read_text())
    grade, merge = flow["jobs"]["grade"], flow["jobs"]["merge"]
    assert grade["strategy"]["matrix"]["shard"] == [1, 2, 3]
    runs = " ".join(step.get("run", "") for step in grade["steps"])
    assert "--shard ${{ matrix.shard }}/3" in runs and f"theinference=={__version__}" in runs
    merges = " ".join(step.get("run", "") for step in merge["steps"])
    assert "gradebook merge shard-*" in merges and "report class-results" in merges
    assert merge["needs"] == "grade"


def test_init_with_ci_github_adds_a_workflow_with_a_job_summary(tmp_path):
    """Would catch `init --ci github` adding nothing, or a workflow that never writes the
    stage table to the job summary."""
    result = runner.invoke(app, ["init", str(tmp_path / "c"), "--ci", "github"])
    assert result.exit_code == 0, result.output
    flow = yaml.safe_load((tmp_path / "c/.github/workflows/theinference.yml").read_text())
    steps = " ".join(step.get("run", "") for step in flow["jobs"]["grade"]["steps"])
    assert "theinference test --json results.json" in steps
    assert 'theinference summary results.json >> "$GITHUB_STEP_SUMMARY"' in steps
    bad = runner.invoke(app, ["init", str(tmp_path / "d"), "--ci", "gitlab"])
    assert bad.exit_code == 2 and "github" in bad.output


def test_summary_prints_the_stage_table(tmp_path):
    """Would catch the job summary losing a stage, its status or its suspected bug."""
    results = {"passed": False, "stages": [
        {"slug": "build-prefill", "status": "failed", "cases": [
            {"status": "passed"}, {"status": "failed", "suspected_bug": "missing-ln-f"}]}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results))
    result = runner.invoke(app, ["summary", str(path)])
    assert "| build-prefill | failed | 1/2 | missing-ln-f |" in result.output
    assert "not all stages passed" in result.output
