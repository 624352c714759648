"""GitHub Actions workflows: the class matrix (the worked example of --shard) and the student's
grade-on-push workflow with its job-summary stage table."""

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from theinference import __version__
from theinference.cli import app
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.json_form import to_json

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
    cases = [CaseResult(name="a", status=Status.PASSED),
             CaseResult(name="b", status=Status.FAILED, suspected_bug="missing-ln-f")]
    stage = StageResult("build-prefill", "Prefill", Status.FAILED, cases=cases)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(to_json(RunResult([stage], "synthetic", "0" * 64))))
    result = runner.invoke(app, ["summary", str(path)])
    assert "| build-prefill | failed | 1/2 | missing-ln-f |" in result.output
    assert "not all stages passed" in result.output


# --- past one machine: Slurm and Kubernetes, their shard commands run here ---------------------

FAKE_SBATCH = """#!/usr/bin/env bash
# Slurm's sbatch, here: an array's tasks run one after another, then a dependent job runs,
# each with the allocation its #SBATCH lines ask for in Slurm's variables (memory in MB)
echo "$*" >> "$SBATCH_LOG"
script="${@: -2:1}"; mode="${@: -1}"; array=""
for a in "$@"; do case $a in --array=*) array=${a#--array=};; esac; done
export SLURM_CPUS_PER_TASK=$(sed -n 's/^#SBATCH --cpus-per-task=//p' "$script")
mem=$(sed -n 's/^#SBATCH --mem=//p' "$script")
case $mem in
  *G) export SLURM_MEM_PER_NODE=$(( ${mem%G} * 1024 ));;
  *M) export SLURM_MEM_PER_NODE=${mem%M};;
esac
if [ -n "$array" ]; then
  for i in $(seq "${array%-*}" "${array#*-}"); do
    SLURM_ARRAY_TASK_ID=$i bash "$script" "$mode" >> "$SBATCH_LOG.out" 2>&1 || exit 1
  done
  echo 4242
else
  bash "$script" "$mode" >> "$SBATCH_LOG.out" 2>&1 || exit 1
  echo 4243
fi
"""


@pytest.fixture
def class_folder(tmp_path, weights) -> Path:
    """classroom_helpers.small_class, and bin/ with `theinference` and a stand-in `sbatch`."""
    from tests.classroom_helpers import small_class

    small_class(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("theinference", f'#!/bin/sh\nexec {sys.executable} -m theinference "$@"\n'),
                       ("sbatch", FAKE_SBATCH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return tmp_path


def local_env(folder: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{folder / 'bin'}:{os.environ['PATH']}", **extra}


def assert_graded_within(folder: Path, cpus: int, memory_bytes: int) -> None:
    """Every record's job had at most the allocation the scheduler gave its shard, and says
    so (the scheduler's figure is `declared` where it is below this machine's)."""
    for path in (folder / "class-results" / "submissions").glob("*.json"):
        share = json.loads(path.read_text())["allocation"]
        assert share["allocation_cpus"] <= cpus and share["jobs"] == 1, share
        assert share["allocation_memory_bytes"] <= memory_bytes, share
        if len(os.sched_getaffinity(0)) > cpus:
            assert share["cpus_from"] == "declared", share


def assert_class_merged(folder: Path) -> None:
    """Every student once, with their own verdict, in the merged results and report."""
    with (folder / "class-results" / "gradebook.csv").open() as f:
        assert sorted(r["student"] for r in csv.DictReader(f)) == ["ann", "bob", "cyd"]
    verdicts = {p.stem: json.loads(p.read_text())["stages"][0]["status"]
                for p in (folder / "class-results" / "submissions").glob("*.json")}
    assert verdicts == {"ann": "todo", "bob": "error", "cyd": "failed"}
    assert (folder / "class-results" / "class.html").is_file()


def test_the_slurm_script_submits_an_array_then_a_merge(class_folder):
    """Would catch a Slurm script whose tasks do not take their shard from the array index,
    a merge that does not wait for the array, or a script that does not run."""
    out = class_folder / "grade-class.slurm"
    made = runner.invoke(app, ["workflow", "slurm", "--shards", "3", "--out", str(out)])
    assert made.exit_code == 0, made.output
    text = out.read_text()
    assert "#SBATCH --job-name=theinference-grade" in text and "bash grade-class.slurm" in text
    log = class_folder / "sbatch.log"
    done = subprocess.run(["bash", str(out)], cwd=class_folder, capture_output=True, text=True,
                          env=local_env(class_folder, SBATCH_LOG=str(log)), timeout=900)
    assert done.returncode == 0, done.stderr + log.with_suffix(".log.out").read_text()[-3000:]
    calls = log.read_text().splitlines()
    assert calls[0].startswith("--parsable --array=1-3 ") and calls[0].endswith(" shard")
    assert "--dependency=afterany:4242" in calls[1] and calls[1].endswith(" merge")
    assert [p.name for p in sorted(class_folder.glob("results-*"))] == [
        "results-1", "results-2", "results-3"]
    assert_class_merged(class_folder)
    assert_graded_within(class_folder, 1, 10 << 30)


def test_the_slurm_task_passes_its_cpus_and_memory(tmp_path):
    """Would catch a task that leaves the grader to size itself to the node: its
    SLURM_CPUS_PER_TASK, and its SLURM_MEM_PER_NODE (or SLURM_MEM_PER_CPU times its CPUs),
    reach `grade` as --cpus and --memory."""
    script = slurm_folder(tmp_path, "--shards", "2")
    cases = [
        ({"SLURM_CPUS_PER_TASK": "4", "SLURM_MEM_PER_NODE": "40960"}, "--cpus 4 --memory 40960M"),
        ({"SLURM_CPUS_PER_TASK": "2", "SLURM_MEM_PER_CPU": "5000"}, "--cpus 2 --memory 10000M"),
        ({}, "--cpus 1"),
    ]
    for slurm, expected in cases:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        done = subprocess.run(["bash", str(script), "shard"], capture_output=True, text=True,
                              cwd=tmp_path, env={**env, **slurm, "SLURM_ARRAY_TASK_ID": "2"},
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith(f"--shard 2/2 {expected}"), done.stdout


ECHO_PYTHON = """#!/bin/sh
# a Python with theinference, here: `-c` succeeds, `-m theinference ...` prints its arguments
case $1 in -c) exit 0;; -m) shift; echo "$@";; esac
"""


def slurm_folder(folder: Path, *options: str) -> Path:
    """A class folder (course/, submissions/) with the Slurm script of `options`, generated
    with a Python that prints what it is asked to run."""
    (folder / "course").mkdir()
    (folder / "course" / "theinference.toml").write_text("")
    (folder / "submissions").mkdir()
    python = folder / "python"
    python.write_text(ECHO_PYTHON)
    python.chmod(0o755)
    script = folder / "grade-class.slurm"
    made = runner.invoke(app, ["workflow", "slurm", *options, "--python", str(python),
                               "--out", str(script)])
    assert made.exit_code == 0, made.output
    return script


def test_the_kubernetes_jobs_grade_by_completion_index_then_merge(class_folder):
    """Would catch an Indexed Job whose pods miss a shard (the index is 0-based, shards
    1-based), a completion count out of step with --shard, or a merge Job that misses one."""
    made = runner.invoke(app, ["workflow", "kubernetes", "--shards", "3", "--claim", "class-pvc"])
    assert made.exit_code == 0, made.output
    grade_job, merge_job = yaml.safe_load_all(made.output)
    spec = grade_job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    assert "kubectl apply -f grade-class.yaml -l step=grade" in made.output
    assert grade_job["metadata"]["labels"] == {"step": "grade"}
    assert merge_job["metadata"]["labels"] == {"step": "merge"}
    for job in (grade_job, merge_job):
        pod = job["spec"]["template"]["spec"]
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "class-pvc"
        assert pod["containers"][0]["workingDir"] == "/work"
    for index in range(3):  # what each pod runs, with the index Kubernetes gives it
        run_container(grade_job, class_folder, JOB_COMPLETION_INDEX=str(index))
    run_container(merge_job, class_folder)
    assert_class_merged(class_folder)
    requests = grade_job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert_graded_within(class_folder, quantity(requests["cpu"]), quantity(requests["memory"]))


def quantity(text: str) -> int:
    """A Kubernetes quantity as the downward API gives it with divisor 1: CPUs rounded up,
    memory in bytes."""
    text = str(text)
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40),
                           ("m", 0.001), ("k", 10**3), ("M", 10**6), ("G", 10**9)):
        if text.endswith(suffix):
            return math.ceil(float(text[: -len(suffix)]) * factor)
    return math.ceil(float(text))


def downward_env(container: dict) -> dict[str, str]:
    """The container's environment as Kubernetes sets it, resource fields resolved."""
    env = {}
    for item in container.get("env", []):
        field = item.get("valueFrom", {}).get("resourceFieldRef")
        if field is None:
            env[item["name"]] = str(item["value"])
            continue
        kind, resource = field["resource"].split(".")
        env[item["name"]] = str(quantity(container["resources"][kind][resource]))
    return env


def run_container(job: dict, folder: Path, **env: str) -> None:
    """The container's command in `folder` (the volume it mounts at its workingDir)."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    done = subprocess.run([*container["command"], *container["args"]], cwd=folder,
                          capture_output=True, text=True,
                          env=local_env(folder, **downward_env(container), **env), timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
