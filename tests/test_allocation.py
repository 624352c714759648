"""The grader sized to its allocation, not the node (grading/allocation.py): CPU affinity, the
cgroup's CPU quota and memory limit (v1 and v2, a limit on an enclosing cgroup too) and a
scheduler's figure, read from fake proc and cgroup trees; then for real, under `taskset -c 0`
(`theinference grade` and the jobs and BLAS threads it gives) and under a real cgroup CPU quota
where this machine lets a test make one."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from theinference.classroom.batch import blas_threads, job_share
from theinference.grading.allocation import (
    AFFINITY,
    DECLARED,
    LIMIT,
    MACHINE,
    QUOTA,
    Allocation,
    available_memory,
    default_jobs,
    own_cgroups,
    parse_size,
    read_allocation,
)

GiB = 2**30
V1_UNLIMITED = 9223372036854771712  # what v1's memory.limit_in_bytes says when there is none
MOUNTINFO_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def fake_tree(root: Path, cgroup: str, mountinfo: str, files: dict[str, str],
              available_gib: float = 64) -> Path:
    """proc/self/cgroup, proc/self/mountinfo, proc/meminfo and the cgroup files under root."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    (root / "proc/meminfo").write_text(
        f"MemTotal:       {128 * 2**20} kB\nMemAvailable:   {int(available_gib * 2**20)} kB\n")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def read(root: Path, affinity: int = 64, machine: int = 64, **declared) -> Allocation:
    return read_allocation(**declared, root=root, affinity=affinity, machine_cpus=machine)


def test_a_container_s_cgroup_v2_quota_and_limit_size_it(tmp_path):
    """Would catch a pod or Gradescope container (cgroup namespace: its cgroup is "/") sized
    to the 64-core node: a quota of 1.5 CPUs is 2 (rounded up), the memory its memory.max."""
    root = fake_tree(tmp_path, "0::/\n", MOUNTINFO_V2, {
        "sys/fs/cgroup/cpu.max": "150000 100000\n",
        "sys/fs/cgroup/memory.max": f"{10 * GiB}\n"})
    got = read(root)
    assert got == Allocation(2, 10 * GiB, QUOTA, LIMIT)
    assert got.text() == "2 CPUs (cgroup quota), 10.0 GiB (memory limit)"


def test_a_limit_on_an_enclosing_cgroup_counts(tmp_path):
    """Would catch reading only the process's own cgroup: Slurm and Kubernetes set the
    job's or pod's limits one level up, the step's or container's cgroup saying "max"."""
    mountinfo = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = fake_tree(tmp_path, "0::/job_42/step_0/user/task_0\n", mountinfo, {
        "sys/fs/cgroup/job_42/cpu.max": "100000 100000\n",
        "sys/fs/cgroup/job_42/memory.max": f"{12 * GiB}\n",
        "sys/fs/cgroup/job_42/step_0/cpu.max": "max 100000\n",
        "sys/fs/cgroup/job_42/step_0/memory.max": "max\n",
        "sys/fs/cgroup/job_42/step_0/user/task_0/cpu.max": "max 100000\n",
        "sys/fs/cgroup/job_42/step_0/user/task_0/memory.max": f"{20 * GiB}\n"})
    assert read(root) == Allocation(1, 12 * GiB, QUOTA, LIMIT)


def test_cgroup_v1_quota_and_limit_with_the_mount_showing_a_subtree(tmp_path):
    """Would catch v1 (cpu.cfs_quota_us over cpu.cfs_period_us, memory.limit_in_bytes) not
    read, a mount of a subtree (Docker: the container's cgroup mounted as the hierarchy) put
    twice into the path, or v1's huge "unlimited" taken for a limit."""
    mountinfo = textwrap.dedent("""\
        31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw
        32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
        35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
        41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
        """)
    cgroup = "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "250000\n",
             "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
             "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{V1_UNLIMITED}\n"}
    root = fake_tree(tmp_path, cgroup, mountinfo, files, available_gib=30)
    assert read(root) == Allocation(3, 30 * GiB, QUOTA, MACHINE)
    (root / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text(f"{4 * GiB}\n")
    (root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us").write_text("-1\n")
    assert read(root) == Allocation(64, 4 * GiB, MACHINE, LIMIT)


def test_the_least_figure_wins_and_says_where_it_came_from(tmp_path):
    """Would catch a source mislabelled (an affinity of the whole machine is the machine),
    the affinity ignored beside a larger quota, or a scheduler's figure that raises what the
    cgroup allows instead of only lowering it."""
    root = fake_tree(tmp_path, "0::/\n", MOUNTINFO_V2, {
        "sys/fs/cgroup/cpu.max": "400000 100000\n", "sys/fs/cgroup/memory.max": "max\n"},
        available_gib=40)
    assert read(root) == Allocation(4, 40 * GiB, QUOTA, MACHINE)
    assert read(root, affinity=2) == Allocation(2, 40 * GiB, AFFINITY, MACHINE)
    assert read(root, affinity=64, machine=64).cpus_from == QUOTA
    assert read(root, declared_cpus=1, declared_memory=10 * GiB) == Allocation(
        1, 10 * GiB, DECLARED, DECLARED)
    assert read(root, declared_cpus=16, declared_memory=100 * GiB) == Allocation(
        4, 40 * GiB, QUOTA, MACHINE)
    bare = fake_tree(tmp_path / "bare", "", "", {})
    assert read(bare, affinity=8, machine=8) == Allocation(8, 64 * GiB, MACHINE, MACHINE)


def test_every_read_tolerates_absence_and_garbage(tmp_path):
    """Would catch a crash (or a zero) where proc or the cgroup files are missing, empty or
    odd, as under gVisor or on macOS: the machine's figures stand."""
    nothing = read_allocation(root=tmp_path / "nowhere", affinity=None, machine_cpus=6)
    assert nothing.cpus >= 1 and nothing.cpus_from in (MACHINE, AFFINITY)
    assert nothing.memory_bytes > 0 and nothing.memory_from == MACHINE  # sysconf's figure
    root = fake_tree(tmp_path / "odd", "garbage\n0::/\n1:cpu:\n", "30 23 0:26 broken\n"
                     + MOUNTINFO_V2, {"sys/fs/cgroup/cpu.max": "lots 0\n",
                                      "sys/fs/cgroup/memory.max": "-5\n"})
    assert read(root, affinity=3) == Allocation(3, 64 * GiB, AFFINITY, MACHINE)
    escaped = "30 23 0:26 / /sys/fs/my\\040cgroups rw - cgroup2 cgroup2 rw\n"
    spaced = fake_tree(tmp_path / "spaced", "0::/a\n", escaped,
                       {"sys/fs/my cgroups/a/cpu.max": "100000 100000\n"})
    assert own_cgroups(spaced).v2[0] == spaced / "sys/fs/my cgroups/a"
    assert read(spaced).cpus == 1


def test_the_memory_limit_and_the_cpus_set_jobs_and_threads(tmp_path):
    """Would catch jobs taken from the node's free memory inside a 10 GB task (it chose 2),
    or BLAS threads from the node's cores: each job's threads are the allocation's CPUs
    shared out among the jobs, and the record says what each job had."""
    root = fake_tree(tmp_path, "0::/\n", MOUNTINFO_V2, {
        "sys/fs/cgroup/memory.max": f"{10 * GiB}\n"}, available_gib=100)
    tight = read(root, affinity=8, machine=64)
    assert default_jobs(8 * GiB, tight) == 1  # 8 GiB cap + 1.5 GiB for the grader
    assert blas_threads(tight, 1) == 8
    (root / "sys/fs/cgroup/memory.max").write_text(f"{20 * GiB}\n")
    roomy = read(root, affinity=8, machine=64)
    assert default_jobs(8 * GiB, roomy) == 2 and blas_threads(roomy, 2) == 4
    assert default_jobs(1 * GiB, roomy) == 8 and blas_threads(roomy, 8) == 1
    assert default_jobs(8 * GiB, Allocation(1, 100 * GiB, QUOTA, MACHINE)) == 1
    assert default_jobs(8 * GiB, Allocation(4, 1 * GiB, MACHINE, LIMIT)) == 1  # never 0
    assert job_share(roomy, 2) == {
        "jobs": 2, "cpus": 4, "memory_bytes": 10 * GiB, "allocation_cpus": 8,
        "allocation_memory_bytes": 20 * GiB, "cpus_from": AFFINITY, "memory_from": LIMIT}


def test_sizes_read_as_slurm_and_kubernetes_write_them():
    """Would catch --memory misreading Slurm's `10240M`, a `10G`, a `10Gi` or the downward
    API's bytes, or taking nonsense for a size."""
    assert parse_size("10240M") == parse_size("10G") == parse_size("10Gi") == 10 * GiB
    assert parse_size("10737418240") == 10 * GiB and parse_size("512MiB") == 512 << 20
    assert parse_size("1.5g") == 3 * GiB // 2
    for bad in ("", "ten", "10X", "-1G", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


# --- for real: this process's own affinity and cgroups ----------------------------------------

PROBE = """
import json, os, sys, tempfile
from theinference.classroom.batch import blas_threads, run_bounded
from theinference.grading.allocation import default_jobs
from theinference.grading.allocation import read_allocation
a = read_allocation()
jobs = default_jobs(1 << 30, a)  # a 1 GiB cap: memory leaves room for several, CPUs decide
out = os.path.join(tempfile.mkdtemp(), "env.json")
child = ("import json, os; json.dump({k: os.environ.get(k) for k in "
         "('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS')}, open(%r, 'w'))" % out)
with open(os.devnull, "wb") as err:
    run_bounded([sys.executable, "-c", child], err, 60, jobs, dict(os.environ))
print(json.dumps({"cpus": a.cpus, "cpus_from": a.cpus_from, "jobs": jobs,
                  "memory_bytes": a.memory_bytes, "memory_from": a.memory_from,
                  "threads": blas_threads(a, jobs), "child": json.load(open(out))}))
"""


def probe(*prefix: str) -> dict:
    """What a grader started under `prefix` reads, chooses, and gives its `theinference test`
    child (the BLAS thread variables it sets)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parents[1]), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def one_cpu_expected(got: dict, source: str) -> None:
    machine = os.cpu_count() or 1
    assert (got["cpus"], got["jobs"], got["threads"]) == (1, 1, 1), got
    assert got["child"] == dict.fromkeys(
        ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1"), got
    assert got["cpus_from"] == (source if machine > 1 else MACHINE), got


def needs_taskset() -> None:
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed (Debian package util-linux)")


def test_under_taskset_one_cpu_is_one_job_and_one_blas_thread():
    """Would catch the jobs or the BLAS threads taken from the node's cores (os.cpu_count())
    when the process is bound to one CPU: a task bound to 1 CPU of 64 would start 64."""
    needs_taskset()
    unbound = probe()
    assert 1 <= unbound["cpus"] <= len(os.sched_getaffinity(0))
    one_cpu_expected(probe("taskset", "-c", "0"), AFFINITY)


def test_theinference_grade_under_taskset_records_one_job_of_one_cpu(tmp_path, weights):
    """Would catch `theinference grade` itself sized to the node under `taskset -c 0`: its
    stderr and each record say what the job had (1 CPU from the affinity, 1 at once), and a
    --jobs above that is refused down to it."""
    from tests import classroom_helpers as ch

    needs_taskset()
    subs = tmp_path / "submissions"
    subs.mkdir()
    ch.add(subs, "stub", None, scratch=tmp_path / "scratch")
    course = ch.make_course(tmp_path / "course")
    (course / "theinference.toml").write_text(
        '[grading]\nstages = ["single-step-attention"]\ntimeout = 60\nmemory_gb = 1\n')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-m", "theinference", "grade", str(subs),
         "--out", str(tmp_path / "results"), "-C", str(course), "--jobs", "4"],
        capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "results/submissions/stub.json").read_text())
    share = record["allocation"]
    assert (share["jobs"], share["cpus"], share["allocation_cpus"]) == (1, 1, 1), share
    if (os.cpu_count() or 1) > 1:
        assert share["cpus_from"] == AFFINITY
        assert "--jobs 4 would oversubscribe" in done.stderr
    assert "allocation: 1 CPU" in done.stderr and "1 at once, 1 BLAS thread each" in done.stderr


def mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, fstype, super options) of this process's cgroup mounts."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) >= 5 and len(after) >= 3 and after[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], after[0], after[2].split(",")))
    return found


def run_in_cgroup(*folders: Path) -> dict:
    """The probe, started inside the cgroups at `folders` (it joins before Python starts)."""
    join = " && ".join(f'echo $$ > "{folder}/cgroup.procs"' for folder in folders)
    return probe("sh", "-c", f'{join} && exec "$@"', "sh")


def test_under_a_real_cgroup_v2_cpu_quota_of_one_cpu():
    """Would catch cpu.max not read (or its path not found from /proc/self/cgroup and
    mountinfo) in a real cgroup v2 with a quota of one CPU: one job, one BLAS thread."""
    v2 = [point for point, fstype, _ in mounts() if fstype == "cgroup2"]
    if not v2:
        pytest.skip("no cgroup2 hierarchy is mounted here")
    top = Path(v2[0])
    offered = (top / "cgroup.controllers").read_text().split()
    if "cpu" not in offered:
        v1 = [p for p, fstype, options in mounts() if fstype == "cgroup" and "cpu" in options]
        why = f"cpu is bound to the v1 hierarchy at {v1[0]}" if v1 else "no cpu controller"
        pytest.skip(f"the cgroup2 hierarchy at {top} offers only {offered or 'nothing'} ({why}),"
                    " so no cgroup v2 CPU quota can be made here")
    if os.geteuid() != 0:
        pytest.skip("making a cgroup with a CPU quota needs root")
    enabled = "cpu" in (top / "cgroup.subtree_control").read_text().split()
    folder = top / f"theinference-test-{uuid.uuid4().hex[:8]}"
    try:
        if not enabled:
            (top / "cgroup.subtree_control").write_text("+cpu")
        folder.mkdir()
        (folder / "cpu.max").write_text("100000 100000")
    except OSError as exc:
        if folder.exists():
            folder.rmdir()
        pytest.skip(f"cannot make a cgroup v2 with a CPU quota under {top}: {exc}")
    try:
        one_cpu_expected(run_in_cgroup(folder), QUOTA)
    finally:
        folder.rmdir()
        if not enabled:
            (top / "cgroup.subtree_control").write_text("-cpu")


def test_under_a_real_cgroup_v1_cpu_quota_of_one_cpu():
    """Would catch cpu.cfs_quota_us over cpu.cfs_period_us not read (or the v1 cpu mount not
    found: here `cpu` alone, often `cpu,cpuacct`) in a real v1 cgroup with a quota of one CPU:
    one job, one BLAS thread."""
    v1 = [point for point, fstype, options in mounts() if fstype == "cgroup" and "cpu" in options]
    if not v1:
        pytest.skip("no cgroup v1 cpu hierarchy is mounted here (a cgroup2-only machine)")
    if os.geteuid() != 0:
        pytest.skip("making a cgroup with a CPU quota needs root")
    top = Path(v1[0])
    folder = top / f"theinference-test-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir()
        (folder / "cpu.cfs_period_us").write_text("100000")
        (folder / "cpu.cfs_quota_us").write_text("100000")
    except OSError as exc:
        if folder.exists():
            folder.rmdir()
        pytest.skip(f"cannot make a cgroup v1 with a CPU quota under {top}: {exc}")
    try:
        one_cpu_expected(run_in_cgroup(folder), QUOTA)
    finally:
        folder.rmdir()


def test_under_a_real_cgroup_v1_memory_limit_the_memory_sets_the_jobs():
    """Would catch memory.limit_in_bytes not read in a real v1 memory cgroup (the node's free
    memory taken instead): 3 GiB holds one job of a 1 GiB cap beside its grader, not two."""
    v1 = [point for point, fstype, options in mounts()
          if fstype == "cgroup" and "memory" in options]
    if not v1:
        pytest.skip("no cgroup v1 memory hierarchy is mounted here (a cgroup2-only machine)")
    if os.geteuid() != 0:
        pytest.skip("making a cgroup with a memory limit needs root")
    if available_memory() < 4 * GiB:
        pytest.skip("under 4 GiB free: a 3 GiB limit would not be the least figure")
    folder = Path(v1[0]) / f"theinference-test-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(str(3 * GiB))
    except OSError as exc:
        if folder.exists():
            folder.rmdir()
        pytest.skip(f"cannot make a cgroup v1 with a memory limit under {v1[0]}: {exc}")
    try:
        got = run_in_cgroup(folder)
    finally:
        folder.rmdir()
    assert (got["memory_bytes"], got["memory_from"]) == (3 * GiB, LIMIT), got
    assert got["jobs"] == 1, got
