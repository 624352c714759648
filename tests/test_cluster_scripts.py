"""The cluster files' options, checks and recovery without a cluster: the Slurm script's text
and what each of its steps runs (with stand-in sbatch, squeue and scancel), and a merge that
keeps exactly the students of the submissions folder."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from tests.test_workflows import slurm_folder
from theinference.cli import app
from theinference.results.submission import SCHEMA

runner = CliRunner()


def run_step(folder: Path, step: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "grade-class.slurm", step], cwd=folder, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=60)


def test_the_slurm_options_reach_the_script_and_its_tasks(tmp_path):
    """Would catch an option dropped from the #SBATCH lines or from `grade`'s command, log
    names with Slurm's 4294967294 for a job outside an array, a file only its owner can read,
    or a script bash cannot parse."""
    script = slurm_folder(tmp_path, "--shards", "3", "--stage", "single-step-attention",
                          "--stage", "build-prefill", "--seed", "7", "--time", "2-00:00:00",
                          "--account", "cs101", "--partition", "cpu", "--logs", "slurm-logs",
                          "--results", "grades")
    text = script.read_text()
    for line in ("#SBATCH --time=2-00:00:00", "#SBATCH --account=cs101",
                 "#SBATCH --partition=cpu", "#SBATCH --output=slurm-logs/%x_%A_%a.out",
                 "GRADE_OPTIONS=(--stage single-step-attention --stage build-prefill --seed 7)",
                 "RESULTS=grades", f"PYTHON={tmp_path / 'python'}"):
        assert line + "\n" in text, line
    assert '--output="$LOGS/%x_%j.out"' in text  # the merge: no array, no task id
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert script.stat().st_mode & 0o777 == 0o644
    shard = run_step(tmp_path, "shard", SLURM_ARRAY_TASK_ID="3")
    assert shard.returncode == 0, shard.stderr
    assert shard.stdout.strip().endswith(
        "--shard 3/3 --cpus 1 --stage single-step-attention --stage build-prefill --seed 7")


def test_the_slurm_script_defaults(tmp_path):
    """Would catch an account or partition line nobody asked for, or a script that runs
    whatever `theinference` PATH finds rather than the install it was generated with."""
    made = runner.invoke(app, ["workflow", "slurm"])
    assert made.exit_code == 0, made.output
    assert "--account" not in made.output and "--partition" not in made.output
    assert f"PYTHON={sys.executable}\n" in made.output
    assert "#SBATCH --time=12:00:00\n" in made.output and "GRADE_OPTIONS=()\n" in made.output


def test_options_a_script_cannot_carry_are_refused(tmp_path):
    """Would catch a value that breaks out of its #SBATCH line or a bash word."""
    for option, value in (("--time", "12h"), ("--partition", "cpu\n#SBATCH --x"),
                          ("--account", "a b"), ("--logs", "logs/%j"), ("--shards", "0")):
        out = tmp_path / "x.slurm"
        made = runner.invoke(app, ["workflow", "slurm", option, value, "--out", str(out)])
        assert made.exit_code == 2 and "Traceback" not in made.output, (option, made.output)
        assert not out.exists()


def test_each_step_first_checks_what_its_node_reaches(tmp_path):
    """Would catch a task that starts grading on a node without the install, the course or
    the submissions (a traceback deep in the grader, or an empty shard) instead of one line
    and its own exit code."""
    slurm_folder(tmp_path, "--shards", "2")
    python = tmp_path / "python"
    python.rename(tmp_path / "elsewhere")
    done = run_step(tmp_path, "shard", SLURM_ARRAY_TASK_ID="1")
    assert done.returncode == 10 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"{python} cannot run theinference" in done.stderr
    (tmp_path / "elsewhere").rename(python)
    (tmp_path / "course" / "theinference.toml").unlink()
    done = run_step(tmp_path, "merge")
    assert done.returncode == 11 and "course/theinference.toml" in done.stderr, done.stderr
    (tmp_path / "course" / "theinference.toml").write_text("")
    (tmp_path / "submissions").rmdir()
    done = run_step(tmp_path, "submit")
    assert done.returncode == 12 and "submissions/" in done.stderr, done.stderr
    (tmp_path / "submissions").mkdir()
    done = run_step(tmp_path, "merge")  # no task left a results folder
    assert done.returncode == 13 and "nothing to merge" in done.stderr, done.stderr


STAND_INS = {
    "sbatch": '#!/bin/sh\nn=$(( $(cat "$0.n" 2>/dev/null || echo 100) + 1 ))\n'
              'echo $n > "$0.n"\necho "$*" >> "$0.log"\necho "$n;cluster"\n',
    "squeue": '#!/bin/sh\necho "$*" >> "$0.log"\necho queued\n',  # every job still queued
    "scancel": '#!/bin/sh\necho "$*" >> "$0.log"\n',
}


def test_a_resubmission_cancels_the_last_ones_jobs_and_says_every_id(tmp_path):
    """Would catch a submission that hides a job id or how to follow it, a resubmission that
    leaves the superseded jobs queued beside the new ones, or one that cancels the array
    before its merge (which would then start on the cancelled tasks)."""
    slurm_folder(tmp_path, "--shards", "2")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    first = run_step(tmp_path, "submit", **env)
    assert first.returncode == 0, first.stderr
    assert "array job 101 (tasks 101_1 to 101_2)" in first.stdout and "job 102" in first.stdout
    assert "squeue -j 101,102" in first.stdout and "sacct -j 101,102" in first.stdout
    assert (tmp_path / "logs" / "jobs").read_text() == "101 102\n"
    assert not (bin_dir / "scancel.log").exists()
    second = run_step(tmp_path, "submit", **env)
    assert second.returncode == 0, second.stderr
    assert (bin_dir / "scancel.log").read_text() == "102\n101\n"  # the merge first
    assert "cancelled job 102" in second.stdout and "cancelled job 101" in second.stdout
    assert (tmp_path / "logs" / "jobs").read_text() == "103 104\n"
    calls = (bin_dir / "sbatch.log").read_text().splitlines()
    assert "--dependency=afterany:103 " in calls[3] and calls[3].endswith(" merge")


def write_record(results: Path, sid: str, status: str = "graded") -> None:
    row = {"slug": "single-step-attention", "status": "passed", "score": 1.0, "max_score": 1.0,
           "suspected_bug": None}
    record = {"schema": SCHEMA, "id": sid, "status": status, "stages": [row], "score": 1.0,
              "max_score": 1.0, "message": "", "content_sha256": "s1", "plan_key": "p",
              "sandbox": "bwrap"}
    (results / "submissions").mkdir(parents=True, exist_ok=True)
    (results / "submissions" / f"{sid}.json").write_text(json.dumps(record))


def test_a_merge_keeps_exactly_the_students_of_the_submissions_folder(tmp_path):
    """Would catch a merge that keeps the grade of a student whose submission is gone (in the
    gradebook, or as an earlier merge's record the report would read), that drops one in
    silence, or that leaves a student no shard graded out of the gradebook."""
    write_record(tmp_path / "results-1", "ann")
    write_record(tmp_path / "results-1", "bob")
    write_record(tmp_path / "results-2", "cyd")
    write_record(tmp_path / "merged", "bob")  # an earlier merge's
    subs = tmp_path / "submissions"
    for sid in ("ann", "cyd", "dan"):  # bob withdrew; dan's shard failed
        (subs / sid).mkdir(parents=True)
    done = runner.invoke(app, ["gradebook", "merge", str(tmp_path / "results-1"),
                               str(tmp_path / "results-2"), "--out", str(tmp_path / "merged"),
                               "--submissions", str(subs)])
    assert done.exit_code == 1, done.output
    assert "2 submissions ->" in done.output and "sandbox: bwrap 2" in done.output
    assert "dropped 1 (their submission is gone" in done.output and ": bob" in done.output
    assert "missing 1 (no shard graded them" in done.output and ": dan" in done.output
    with (tmp_path / "merged" / "gradebook.csv").open() as f:
        rows = {r["student"]: r["status"] for r in csv.DictReader(f)}
    assert rows == {"ann": "graded", "cyd": "graded", "dan": "missing"}
    kept = sorted(p.stem for p in (tmp_path / "merged" / "submissions").glob("*.json"))
    assert kept == ["ann", "cyd"]
    everyone = runner.invoke(app, ["gradebook", "merge", str(tmp_path / "results-1"),
                                   "--out", str(tmp_path / "all")])
    assert everyone.exit_code == 0 and "2 submissions" in everyone.output  # no class: all kept


def test_a_merge_with_a_grader_error_is_unfinished(tmp_path):
    """Would catch a merge that reports success over a submission the grader could not
    finish (a shard that failed that way would pass unnoticed)."""
    write_record(tmp_path / "results-1", "ann")
    write_record(tmp_path / "results-1", "bob", status="grader-error")
    done = runner.invoke(app, ["gradebook", "merge", str(tmp_path / "results-1"),
                               "--out", str(tmp_path / "merged")])
    assert done.exit_code == 1 and "unfinished 1" in done.output and ": bob" in done.output


def test_the_kubernetes_jobs_carry_the_options_and_merge_the_class(tmp_path):
    """Would catch a pod that grades other stages or another seed than asked, or a merge Job
    that does not keep to the submissions folder's students."""
    made = runner.invoke(app, ["workflow", "kubernetes", "--shards", "2", "--stage",
                               "build-prefill", "--seed", "3", "--results", "grades"])
    assert made.exit_code == 0, made.output
    grade_job, merge_job = yaml.safe_load_all(made.output)
    grade = grade_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    merge = merge_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "--shard $I/2 \\\n  --stage build-prefill --seed 3" in grade
    assert "--out grades --submissions submissions" in merge
    assert "Complete|Failed" in made.output  # the merge waits for the grading Job's end
    for script in (grade, merge):
        assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
