"""Containment of the student's process in each mode (bwrap, a fresh unprivileged uid, and
`none` as the grader's own user): every process it starts is counted and killed with its call,
its memory cap holds against shared mappings and memory-backed files, and (dropped) a process
of one submission can reach nothing of another's. Attack classes 6, 7, 9 and 13 of the
hostile catalogue, at the level of the student's process; test_containment_cli.py grades them.
"""

import json
import os
import pwd
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.test_hostile import ESCAPEE, NAME_ME, escapees
from theinference.student import sandbox
from theinference.student.process import StudentProcess
from theinference.student.sandbox import Sandbox
from theinference.student.setup import Limits, ProcessSetup

NO_UNPRIVILEGED = "THEINFERENCE_TEST_NO_UNPRIVILEGED"  # set by hand only: .ci/run never does


def require_unprivileged() -> Sandbox:
    """The unprivileged-user sandbox; fails (never skips) where it cannot apply, unless
    NO_UNPRIVILEGED says this machine cannot (a grader that is not root)."""
    if os.environ.get(NO_UNPRIVILEGED):
        pytest.skip(f"{NO_UNPRIVILEGED} is set: the unprivileged drop is not tested here")
    chosen = sandbox.choose("none")
    assert chosen.kind == "unprivileged-user", (
        f"the unprivileged drop cannot apply here ({'; '.join(chosen.notes) or 'not root'}): "
        f"run as root from a Python others can read (.ci/run), or set {NO_UNPRIVILEGED}"
    )
    return chosen


def sandbox_for(kind: str) -> Sandbox:
    if kind == "unprivileged-user":
        return require_unprivileged()
    return Sandbox(kind)


needs_bwrap = pytest.mark.skipif(
    bool(sandbox.bwrap_problem()), reason=f"bubblewrap unusable here: {sandbox.bwrap_problem()}"
)
MODES = [pytest.param("bwrap", marks=needs_bwrap), "unprivileged-user", "none"]


def course_with(root: Path, adapters: str) -> Path:
    for folder in ("tests", "src"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "tests" / "adapters.py").write_text(textwrap.dedent(adapters))
    return root


def process(course: Path, kind: str, **limits) -> StudentProcess:
    limits = {"timeout": 60, **limits}
    return StudentProcess(ProcessSetup(
            course, Path("/nonexistent"), Limits(**limits), sandbox=sandbox_for(kind)))


HELPER = """
import os, time

def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        sum(range(20000))  # arithmetic: user time, as a recompute's

def helper(seconds):
    # fork, setsid, fork again: the grandchild does the work outside the worker's session
    # and, once its parent exits, outside its descent too; the result comes back on a pipe
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(read)
            spin(seconds)
            os.write(write, b"done")
            os._exit(0)
        os._exit(0)
    os.close(write)
    answer = b""
    while chunk := os.read(read, 64):
        answer += chunk
    return [float(answer == b"done")]
"""


@pytest.mark.parametrize("kind", MODES)
def test_a_detached_helper_is_counted_and_stopped_at_the_cpu_limit(kind, tmp_path):
    """Attack 6: would catch a CPU measure blind to a helper that left the worker's session
    and descent (double fork + setsid): its second of work would read as nothing."""
    course = course_with(tmp_path / "c", HELPER)
    with process(course, kind) as student:
        out = student.call("helper", [1.0])
        assert out.kind == "returned" and out.value.tolist() == [1.0], out.message
        assert out.cpu_seconds >= 0.8, out.cpu_seconds
        stopped = student.call("helper", [30.0], cpu_limit=0.5)
        assert stopped.kind == "cpu_limit" and stopped.seconds < 15, stopped.message


DAEMON = f"""
import os, sys, time

def daemon(ids):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            code = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'{ESCAPEE}', 0, 0, 0); "
            code += "time.sleep(600)"
            os.execve(sys.executable, [sys.executable, "-c", code], {{}})  # no token left
        os._exit(0)
    time.sleep(0.5)
    return [float(os.getpid())]
"""


@pytest.mark.parametrize("kind", MODES)
def test_a_daemon_that_reexecs_with_a_clean_environment_dies_with_its_call(kind, tmp_path):
    """Attack 7: would catch a daemon that double-forks, calls setsid and re-executes itself
    without the run's token surviving its call (and so the grader), or the sweep that kills
    it taking the worker too (the next call would need a new process)."""
    course = course_with(tmp_path / "c", DAEMON)
    with process(course, kind) as student:
        first = student.call("daemon", [[1]])
        assert first.kind == "returned", first.message
        time.sleep(0.3)
        assert not escapees(), "the daemon outlived the call that started it"
        second = student.call("daemon", [[1]])
        assert second.kind == "returned" and student.startups == 1, second.message
        assert second.value.tolist() == first.value.tolist()  # the same worker
    time.sleep(0.3)
    assert not escapees()


HOPPER = f"""
import ctypes, os, select, sys, time

def hop(beats):
    # a daemon that changes pid every 2 ms (it forks, the parent exits), writes how many times
    # it hopped to `beats` (where the test can read it), and takes whatever the worker is asked
    # next from its request pipe (inherited): alive at a later call, it answers it
    requests = int(sys.argv[1])
    if os.fork() == 0:
        os.setsid()
        {NAME_ME}
        hops = 0
        while True:
            time.sleep(0.002)
            if os.fork() != 0:
                os._exit(0)
            hops += 1
            if beats:
                try:
                    with open(beats, "w") as f:
                        f.write(str(hops))
                except OSError:
                    pass
            if select.select([requests], [], [], 0)[0]:
                os.read(requests, 1 << 16)
    time.sleep(0.3)  # it hops during the call
    return [float(os.getpid())]

def pid(ids):
    return [float(os.getpid())]
"""


def hopping(beats: Path | None) -> bool:
    """Whether the hopper still runs: its count moves (where it can write where the test
    reads), or a look at /proc finds it in one of several tries (a single look can miss a
    process that is between two pids)."""
    if beats is not None:
        before = beats.read_text() if beats.exists() else ""
        time.sleep(0.2)
        if (beats.read_text() if beats.exists() else "") != before:
            return True
    for _ in range(20):
        if escapees():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("cgroup", ["a cgroup", "no cgroup"])
@pytest.mark.parametrize("kind", MODES)
def test_a_daemon_that_hops_pids_is_gone_after_its_call(kind, cgroup, tmp_path, monkeypatch):
    """Catches a daemon that changes pid every 2 ms outliving the call that started it (an
    end-of-call sweep whose look finds nothing while it is between two pids) and taking a
    later call's request: in each mode, with the worker in a cgroup (frozen, then emptied) and
    without one (the worker is then stopped: its uid emptied, bwrap's namespace ended)."""
    from theinference.student import cgroups

    if cgroup == "no cgroup":
        monkeypatch.setattr(cgroups, "home", lambda: (None, "switched off by the test"))
    elif cgroups.home()[0] is None:
        pytest.skip(f"no cgroup can be made here: {cgroups.home()[1]}")
    course = course_with(tmp_path / "c", HOPPER)
    shared = Path(tempfile.mkdtemp(prefix="ti-hop-"))  # one the student's uid can write
    shared.chmod(0o777)
    beats = None if kind == "bwrap" else shared / "beats"  # bwrap's /tmp is its own
    try:
        with process(course, kind, timeout=10) as student:
            for _ in range(3):
                out = student.call("hop", [str(beats or "")])
                assert out.kind == "returned", out.message
                assert not hopping(beats), "the daemon outlived the call that started it"
                later = student.call("pid", [[1]])
                assert later.kind == "returned", (later.kind, later.message)
        assert not hopping(beats)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


SHARED_MAPPING = """
import mmap, os, time

def shared(ids):
    size = 500 << 20
    area = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    for offset in range(0, size, 1 << 20):
        area[offset:offset + (1 << 20)] = b"x" * (1 << 20)
    time.sleep(5)  # held
    return [1.0]

def small(ids):
    return [2.0]

def in_file(folder):
    folder = os.environ.get(folder, folder)
    path = os.path.join(folder, "ballast")
    try:
        with open(path, "wb") as f:
            for _ in range(500):
                f.write(b"x" * (1 << 20))
    except OSError as exc:
        print("stopped writing:", exc)
    time.sleep(5)  # held
    return [float(os.path.getsize(path))]
"""
CAP = {"memory_bytes": int(0.2 * 2**30)}


@pytest.mark.parametrize("kind", MODES)
def test_a_shared_anonymous_mapping_counts_against_the_memory_cap(kind, tmp_path):
    """Attack 9: would catch 500 MiB held through MAP_SHARED|MAP_ANONYMOUS (which
    RLIMIT_DATA does not count) under a 0.2 GiB cap, or a worker left running after the
    breach (the next call would then read the old call's late reply)."""
    course = course_with(tmp_path / "c", SHARED_MAPPING)
    with process(course, kind, **CAP) as student:
        out = student.call("shared", [[1]])
        after = student.call("small", [[1]])
        startups = student.startups
    assert out.kind == "memory_limit", (out.kind, out.message)
    assert "the grader's limit: 0.2 GiB" in out.message and out.seconds < 5
    assert after.kind == "returned" and after.value.tolist() == [2.0] and startups == 2


@pytest.mark.parametrize(
    "kind, folder",
    [("bwrap", "TMPDIR"), ("bwrap", "HOME"), ("bwrap", "/dev/shm")]
    + [("unprivileged-user", "/dev/shm")],
)
def test_a_file_in_a_memory_backed_folder_counts_against_the_memory_cap(kind, folder, tmp_path):
    """Attack 9: would catch 500 MiB held in a file of the private /tmp (a tmpfs of half the
    machine's memory before), HOME or /dev/shm under a 0.2 GiB cap; and a dropped uid's file
    in the host's /dev/shm left behind after its process stops."""
    if kind == "bwrap" and sandbox.bwrap_problem():
        pytest.skip(f"bubblewrap unusable here: {sandbox.bwrap_problem()}")
    course = course_with(tmp_path / "c", SHARED_MAPPING)
    with process(course, kind, **CAP) as student:
        out = student.call("in_file", [folder])
        uid = student.uid
    assert out.kind == "memory_limit", (out.kind, out.message, out.stdout)
    if uid is not None:
        assert not [p for p in Path("/dev/shm").iterdir() if p.stat().st_uid == uid]


IDENTITY = """
import ctypes, json, os

def probe(pid):
    seen = {"uid": os.getuid(), "env": sorted(os.environ)}
    def attempt(name, fn):
        try:
            fn()
            seen[name] = "ok"
        except OSError as exc:
            seen[name] = type(exc).__name__
    attempt("signal", lambda: os.kill(pid, 0))
    attempt("environ", lambda: open(f"/proc/{pid}/environ", "rb").read())
    attempt("fds", lambda: os.listdir(f"/proc/{pid}/fd"))
    libc = ctypes.CDLL(None, use_errno=True)
    seen["ptrace"] = "ok" if libc.ptrace(16, pid, 0, 0) == 0 else os.strerror(ctypes.get_errno())
    if os.fork() == 0:  # a process of this very uid, against its own worker
        try:
            os.listdir(f"/proc/{os.getppid()}/fd")
            os.write(1, b"own-fds:ok\\n")
        except OSError:
            os.write(1, b"own-fds:refused\\n")
        os._exit(0)
    os.wait()
    print(json.dumps(seen))
    return [float(os.getpid())]
"""


def test_each_submission_gets_an_identity_that_reaches_no_other(tmp_path):
    """Attack 13: would catch every submission sharing one uid (`nobody`), so that a process
    left by one could signal, ptrace or read the pipes of another's worker; a dumpable worker
    whose descriptors a process of its own uid can take; or the grader's environment handed
    to the student."""
    require_unprivileged()
    one, two = (course_with(tmp_path / name, IDENTITY) for name in ("one", "two"))
    with process(one, "unprivileged-user") as first, process(two, "unprivileged-user") as second:
        target = first.call("probe", [os.getpid()])  # its own pid, asked of the grader
        assert target.kind == "returned", target.message
        out = second.call("probe", [int(target.value[0])])
        uids = (first.uid, second.uid)
    assert out.kind == "returned", out.message
    seen = json.loads(out.stdout.splitlines()[-1])
    accounts = {e.pw_uid for e in pwd.getpwall()}
    assert uids[0] != uids[1] and not set(uids) & (accounts | {0, 65534})
    assert seen["uid"] == uids[1]
    assert seen["signal"] == "PermissionError" and seen["environ"] == "PermissionError"
    assert seen["fds"] == "PermissionError" and seen["ptrace"] != "ok"
    assert "own-fds:refused" in out.stdout  # not dumpable: not even its own uid gets in
    assert seen["env"] == sorted(
        ["HOME", "PATH", "USER", "TMPDIR", "THEINFERENCE_WEIGHTS", "PYTHONDONTWRITEBYTECODE"]
        + ["THEINFERENCE_RUN_TOKEN", *sandbox.KEPT_HEAP]
        + [k for k in os.environ if k in sandbox.PASSED_ENV]
        + [k for k in os.environ if k.startswith(sandbox.PASSED_PREFIXES)]
    )


@pytest.mark.parametrize("kind", MODES)
def test_the_environment_is_clean_in_every_mode(kind, tmp_path, monkeypatch):
    """Would catch the grader's whole environment (its cache's path, its seed, a CI's
    secrets) handed to the student's process outside bubblewrap."""
    monkeypatch.setenv("THEINFERENCE_SEED", "12345")
    monkeypatch.setenv("SOME_CI_SECRET", "hunter2")
    adapters = "import json, os\ndef env(ids):\n    print(json.dumps(sorted(os.environ)))\n"
    course = course_with(tmp_path / "c", adapters + "    return [1.0]\n")
    with process(course, kind) as student:
        out = student.call("env", [[1]])
    assert out.kind == "returned", out.message
    names = set(json.loads(out.stdout))
    assert not {"THEINFERENCE_SEED", "SOME_CI_SECRET", "THEINFERENCE_CACHE_DIR"} & names
    assert {"HOME", "PATH", "TMPDIR", "THEINFERENCE_WEIGHTS", "THEINFERENCE_RUN_TOKEN"} <= names


GRADER = """
import sys, time
from pathlib import Path
from theinference.student.process import StudentProcess
from theinference.student.setup import Limits, ProcessSetup
from theinference.student.sandbox import Sandbox
course, kind = Path(sys.argv[1]), sys.argv[2]
student = StudentProcess(ProcessSetup(
        course, Path("/nonexistent"), Limits(), sandbox=Sandbox(kind)))
student.call("busy", [[1]], timeout=600)  # killed during this call
"""


@pytest.mark.parametrize("kind", MODES)
def test_a_grader_killed_outright_takes_its_worker_with_it(kind, tmp_path):
    """Would catch a worker that outlives a grader killed with SIGKILL in the middle of a
    call (no chance to stop it): re-parented to init, it would go on running the student's
    code unwatched (an idle worker ends by itself when its request pipe closes)."""
    import signal
    import subprocess
    import sys

    sandbox_for(kind)
    adapters = "import ctypes, os, sys, time\ndef busy(ids):\n"
    adapters += f"    {NAME_ME}\n    print('busy', file=sys.stderr, flush=True)\n"
    adapters += "    time.sleep(600)\n"
    course = course_with(tmp_path / "c", adapters)
    grader = subprocess.Popen(
        [sys.executable, "-c", GRADER, str(course), kind],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        deadline = time.monotonic() + 60
        while not escapees() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert escapees(), "the worker should be busy in its call while its grader runs"
        grader.send_signal(signal.SIGKILL)
        grader.wait()
        time.sleep(0.5)
        assert not escapees(), "the worker outlived its grader"
    finally:
        grader.kill()
        for pid in escapees():  # this test's own worker, should it have survived
            os.kill(pid, signal.SIGKILL)


def test_the_students_blas_runs_one_thread_unless_the_grader_says_otherwise(monkeypatch):
    """Would catch a student's process left to BLAS's own thread count (idle threads spin: a
    one-row product then costs several times its CPU on a busy machine, and CPU time is what
    the cost checks measure), or an instructor's explicit thread count overridden."""
    for name in sandbox.ONE_BLAS_THREAD:
        monkeypatch.delenv(name, raising=False)
    env = sandbox.student_env(("T", "t"), "/h", "/tmp", "/w", "/bin")
    assert all(env[name] == "1" for name in sandbox.ONE_BLAS_THREAD)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    env = sandbox.student_env(("T", "t"), "/h", "/tmp", "/w", "/bin")
    assert env["OPENBLAS_NUM_THREADS"] == "4"


QUICK = """
def quick(ids):
    return len(ids)
"""


@pytest.mark.parametrize("kind", MODES)
def test_a_worker_starting_while_another_call_ends_is_not_taken_for_its_leftovers(
    kind, tmp_path, monkeypatch
):
    """Catches a worker killed as it starts: the end of a call in another thread (a case beside
    it, or the rate measured beside a try) looks for processes the call left behind among the
    grader's children started since, and a worker whose process exists but whose pid is not yet
    among the workers' roots was one of them (its first call then died of SIGKILL)."""
    import threading

    from theinference.student import startup

    course = course_with(tmp_path / "c", QUICK)
    ending, starting = process(course, kind), process(course, kind)
    assert ending.call("quick", [[1]]).kind == "returned"
    real_popen, calls_ended, beside = startup.subprocess.Popen, [], []

    def slow_to_register(*args, **options):  # a worker whose exec takes a while to be known
        popen = real_popen(*args, **options)
        beside.append(threading.Thread(target=lambda: calls_ended.extend(
            ending.call("quick", [[1]]).kind for _ in range(3))))
        beside[0].start()
        beside[0].join(timeout=1.0)  # the other calls end meanwhile (or wait for the start)
        return popen

    monkeypatch.setattr(startup.subprocess, "Popen", slow_to_register)
    try:
        outcome = starting.call("quick", [[1, 2]])
        monkeypatch.undo()
        beside[0].join(timeout=30)
        assert outcome.kind == "returned" and outcome.value == 2, (outcome.kind, outcome.message)
        assert calls_ended == ["returned"] * 3, calls_ended
    finally:
        starting.close()
        ending.close()


GROWING_CACHE = """
import resource

import numpy as np


def grow(steps):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    row = np.ones((12, 1, 64), np.float32)
    for _ in range(3):
        k = np.zeros((12, 0, 64), np.float32)
        for _ in range(steps):  # a cache concatenated at every step, as a first try's often is
            k = np.concatenate([k, row], axis=1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
"""


@pytest.mark.parametrize("kind", MODES)
def test_the_students_large_arrays_reuse_its_heap(kind, tmp_path):
    """Catches a student's process left to glibc's default heap: each growing array is mapped
    and unmapped afresh, its pages faulted in at every step (about 400,000 faults here, which a
    sandbox makes slow: single-step's failing try cost twice its passing one), where the
    student's own process, warmed by its earlier calls, mostly reuses its heap."""
    worker = process(course_with(tmp_path / "c", GROWING_CACHE), kind)
    try:
        outcome = worker.call("grow", [1024])
        assert outcome.kind == "returned", outcome.message
        assert outcome.value < 40_000, outcome.value
    finally:
        worker.close()


def own_zombies() -> set[int]:
    """The ended processes still waiting for this process to reap them."""
    children: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        children |= {int(pid) for pid in (task / "children").read_text().split()}
    ended = set()
    for pid in children:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in "ZX":
            ended.add(pid)
    return ended


@needs_bwrap
def test_bubblewraps_probes_leave_no_zombie():
    """Catches a probe of bubblewrap (can it make its namespaces, can it size a tmpfs) whose
    PID 1 comes to the grader, a subreaper, when the outer bwrap ends: each command left one
    zombie, which outlived the grader where nothing reaps orphans."""
    from theinference.student import reaper

    assert reaper.become_subreaper()
    before = own_zombies()
    for probe in (sandbox.bwrap_problem, sandbox.bwrap_sizes_tmpfs):
        probe.cache_clear()
        probe()
    assert own_zombies() <= before, own_zombies() - before
