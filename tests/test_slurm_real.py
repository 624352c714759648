"""`theinference workflow slurm` on a real one-node Slurm (tests/slurm_cluster.py): submitted as
docs/instructors.md says, its merged gradebook is the one a single `grade` writes; a task that
fails leaves a merge that ends and names the student it lacks, and submitting again cancels the
superseded jobs and recovers. Skipped, with the reason, where Slurm is not installed or the test
is not root (.ci/run installs slurm-wlm and munge as root). About 2-3 minutes."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.test_workflows import assert_class_merged

# one cluster (`cluster`) for both tests: two at once would share its ports
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_slurm_real")]

WAIT = 600  # seconds a whole submission may take before the test fails


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = slurm_cluster.unavailable()
    if reason:
        pytest.skip(reason)
    try:
        running = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except RuntimeError as exc:
        pytest.skip(f"Slurm's daemons do not run here: {exc}")
    yield running
    running.stop()


@pytest.fixture
def small_class(tmp_path, weights) -> Path:
    from tests.classroom_helpers import small_class

    return small_class(tmp_path / "class")


def theinference(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "theinference", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=WAIT)


def submit(cluster, folder: Path, **env: str) -> dict[str, str]:
    """`bash grade-class.slurm` as docs/instructors.md says; the job ids it printed."""
    env = {**os.environ, "SLURM_CONF": cluster.env["SLURM_CONF"], **env}
    done = subprocess.run(["bash", "grade-class.slurm"], cwd=folder, capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    array, merge = (folder / "logs" / "jobs").read_text().split()
    assert f"squeue -j {array},{merge}" in done.stdout, done.stdout
    assert f"sacct -j {array},{merge}" in done.stdout, done.stdout
    return {"array": array, "merge": merge, "out": done.stdout}


def task_states(cluster, array: str) -> dict[str, tuple[str, str]]:
    """Each array task's state and exit code, by task index."""
    lines = cluster.run("scontrol", "-o", "show", "job", array).stdout.splitlines()
    fields = [dict(w.split("=", 1) for w in line.split() if "=" in w) for line in lines]
    return {f["ArrayTaskId"]: (f["JobState"], f["ExitCode"]) for f in fields}


def gradebook_rows(folder: Path) -> dict[str, dict]:
    with (folder / "class-results" / "gradebook.csv").open() as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def test_a_submitted_class_merges_to_the_one_shot_gradebook(cluster, small_class):
    """Would catch a script Slurm rejects, tasks that miss their shard or fail where the
    install is not on PATH (SBATCH_EXPORT exports only the cache here, no venv), log names
    that do not read JOBNAME_JOB_TASK, a task log without its sandbox, or a merged gradebook
    that differs from a single run's."""
    folder = small_class
    made = theinference("workflow", "slurm", "--shards", "3", "--out", "grade-class.slurm",
                        cwd=folder)
    assert made.returncode == 0, made.stderr
    exported = "THEINFERENCE_CACHE_DIR,THEINFERENCE_TEST_CACHE,HOME"
    jobs = submit(cluster, folder, SBATCH_EXPORT=exported)
    cluster.wait_idle(WAIT)
    states = task_states(cluster, jobs["array"])
    assert states == {str(i): ("COMPLETED", "0:0") for i in (1, 2, 3)}, states
    assert cluster.state(jobs["merge"])["JobState"] == "COMPLETED"
    for i in (1, 2, 3):
        log = (folder / "logs" / f"theinference-grade_{jobs['array']}_{i}.out").read_text()
        assert "sandbox: " in log, log
    merge_log = (folder / "logs" / f"theinference-merge_{jobs['merge']}.out").read_text()
    assert "3 submissions ->" in merge_log and "sandbox: " in merge_log, merge_log
    assert_class_merged(folder)
    once = theinference("grade", "submissions", "--out", "one-shot", "--course-dir", "course",
                        cwd=folder)
    assert once.returncode == 0, once.stderr[-3000:]
    diff = theinference("gradebook", "diff", "one-shot", "class-results", cwd=folder)
    assert diff.returncode == 0, diff.stdout
    assert (folder / "one-shot" / "gradebook.csv").read_text() == (
        folder / "class-results" / "gradebook.csv").read_text()


def test_a_failed_task_ends_the_merge_and_a_resubmission_recovers(cluster, small_class, tmp_path):
    """Would catch a merge left pending behind a failed task, a merge that drops the student
    it lacks in silence, a resubmission that leaves the superseded jobs queued, or one that
    does not grade what is missing."""
    from theinference.classroom.batch import in_shard

    folder = small_class
    failing = next(i for i in (1, 2, 3) if in_shard("cyd", (i, 3)))
    lost = sorted(s for s in ("ann", "bob", "cyd") if in_shard(s, (failing, 3)))
    broken = tmp_path / "broken"  # while it exists, task `failing`'s node lacks the install
    broken.touch()
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$SLURM_ARRAY_TASK_ID" = {failing} ] && [ -e {broken} ] '
                      f'&& exit 1\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    made = theinference("workflow", "slurm", "--shards", "3", "--python", str(python),
                        "--out", "grade-class.slurm", cwd=folder)
    assert made.returncode == 0, made.stderr
    first = submit(cluster, folder)
    second = submit(cluster, folder)  # at once: the first submission is superseded
    for job in (first["merge"], first["array"]):
        assert f"cancelled job {job}" in second["out"], second["out"]
    assert cluster.state(first["merge"])["JobState"] == "CANCELLED"
    cluster.wait_idle(WAIT)
    states = task_states(cluster, second["array"])
    assert states[str(failing)] == ("FAILED", "10:0"), states
    merge = cluster.state(second["merge"])
    assert (merge["JobState"], merge["ExitCode"]) == ("FAILED", "1:0"), merge
    merge_log = (folder / "logs" / f"theinference-merge_{second['merge']}.out").read_text()
    assert f"task {failing} left no results" in merge_log, merge_log
    assert f"missing {len(lost)} (no shard graded them" in merge_log, merge_log
    rows = gradebook_rows(folder)
    assert sorted(rows) == ["ann", "bob", "cyd"]
    assert sorted(s for s, r in rows.items() if r["status"] == "missing") == lost, rows
    task_log = (folder / "logs" / f"theinference-grade_{second['array']}_{failing}.out")
    assert f"{python} cannot run theinference" in task_log.read_text()

    broken.unlink()  # the node is repaired: submit again, as the docs say
    third = submit(cluster, folder)
    cluster.wait_idle(WAIT)
    assert cluster.state(third["merge"])["JobState"] == "COMPLETED"
    assert_class_merged(folder)
    assert all(r["status"] != "missing" for r in gradebook_rows(folder).values())
    assert cluster.queued() == [], "jobs of ours still queued"
    assert os.stat(folder / "grade-class.slurm").st_mode & 0o777 == 0o644
