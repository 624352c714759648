"""The CPU account of measured calls (student/account.py): a cgroup that counts every process
the student's code starts, however it ends, where one can be had that the student's process
cannot leave; else a worker forbidden to start a process, whose attempt fails the call saying
so; never a pass on CPU the grader cannot see."""

import os
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import make_course, reference_text
from tests.test_cache_use import CHEATS, proof_stage
from theinference.course.languages import PYTHON, TYPESCRIPT
from theinference.curriculum.stages import load_stages
from theinference.results import Status
from theinference.student import account, cgroups, sandbox, startup
from theinference.student.process import StudentProcess
from theinference.student.sandbox import Sandbox
from theinference.student.setup import Limits, ProcessSetup

TRICKS = """
import os, signal, sys, threading, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        sum(range(20000))  # arithmetic: user time, as a recompute's

def auto_reaped(seconds):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps it: no counter keeps it
    done, tell = os.pipe()
    if os.fork() == 0:
        burn(seconds)
        os._exit(0)
    os.close(tell)
    os.read(done, 1)  # end of file: the child has exited
    return [1.0]

def double_forked(seconds):
    done, tell = os.pipe()
    if os.fork() == 0:
        if os.fork() == 0:
            os.close(done)
            burn(seconds)
            os._exit(0)
        os._exit(0)
    os.close(tell)
    os.read(done, 1)
    return [1.0]

def execd(seconds):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    done, tell = os.pipe()
    os.set_inheritable(tell, True)
    code = f"import time\\nend = time.process_time() + {seconds}\\n"
    code += "while time.process_time() < end: sum(range(20000))"
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", code])
    os.close(tell)
    os.read(done, 1)
    return [1.0]

def threads(seconds):
    def spin():
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            sum(range(20000))  # arithmetic: user time, as a recompute's
    workers = [threading.Thread(target=spin) for _ in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return [1.0]

def leave(_):
    # every cgroup this process can name, its own parent's first: none may take it
    moved = []
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/cpuacct"):
        try:
            with open(os.path.join(root, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
            moved.append(root)
        except OSError:
            pass
    return [float(len(moved))]
"""
# adapter -> CPU seconds it burns for an argument of 0.4
TRUTH = {"auto_reaped": 0.4, "double_forked": 0.4, "execd": 0.4, "threads": 0.8}
NO_CGROUP, WHY_NOT = cgroups.home()
CGROUP_KIND = "bwrap" if not sandbox.bwrap_problem() else "unprivileged-user"
needs_cgroup = pytest.mark.skipif(
    NO_CGROUP is None or (CGROUP_KIND == "unprivileged-user" and os.geteuid() != 0),
    reason=f"no cgroup account here: {WHY_NOT or 'neither bwrap nor a root grader'}",
)


def course_with_tricks(root: Path) -> Path:
    for folder in ("tests", "src"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "tests" / "adapters.py").write_text(textwrap.dedent(TRICKS))
    os.chmod(root, 0o755)
    return root


def student(tmp_path: Path, kind: str) -> StudentProcess:
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    course = course_with_tricks(tmp_path / "c")
    return StudentProcess(ProcessSetup(course, weights, Limits(timeout=60), sandbox=Sandbox(kind)))


@needs_cgroup
@pytest.mark.parametrize("adapter", list(TRUTH))
def test_the_cgroup_account_counts_every_process_however_it_ends(adapter, tmp_path):
    """Catches CPU lost with a child the kernel reaped (SIGCHLD ignored), a double-forked or
    exec'd one, or threads: a recompute run there would pass a floor it never met."""
    with student(tmp_path, CGROUP_KIND) as process:
        assert process.cpu_account.startswith("cgroup"), process.notes
        outcome = process.call_alone(adapter, [0.4], 60, 30.0)
    truth = TRUTH[adapter]
    assert outcome.kind == "returned", outcome.message
    assert truth * 0.8 <= outcome.cpu_seconds <= truth * 3 + 0.3, (adapter, outcome.cpu_seconds)


@needs_cgroup
def test_a_call_over_budget_in_an_unseen_child_is_stopped_at_it(tmp_path):
    """Catches a CPU limit polled from /proc alone: the auto-reaped child's CPU must stop the
    call at its budget, not at the wall-clock timeout."""
    with student(tmp_path, CGROUP_KIND) as process:
        outcome = process.call_alone("auto_reaped", [30.0], 60, 0.5)
    assert outcome.kind == "cpu_limit", outcome.message
    assert outcome.seconds < 20


@needs_cgroup
def test_the_student_cannot_leave_its_cgroup_and_it_is_removed(tmp_path):
    """Catches a cgroup the student's process could move itself out of (it would take its
    children's CPU with it), or one left behind when the worker stops."""
    with student(tmp_path, CGROUP_KIND) as process:
        outcome = process.call_alone("leave", [0], 60, 30.0)
    assert outcome.kind == "returned" and float(outcome.value[0]) == 0.0, outcome
    assert not list(NO_CGROUP.path.glob(f"{cgroups.PREFIX}{os.getpid()}-*"))


@pytest.mark.parametrize("adapter", ["auto_reaped", "double_forked", "execd"])
def test_a_guarded_worker_that_starts_a_process_fails_saying_so(adapter, tmp_path):
    """Catches a guarded worker (no cgroup it cannot leave: here the grader's own user) whose
    child goes unseen, or a failure that does not say the call started a process."""
    with student(tmp_path, "none") as process:
        assert process.cpu_account == "seccomp", process.notes
        outcome = process.call_alone(adapter, [0.4], 60, 30.0)
        threaded = process.call_alone("threads", [0.2], 60, 30.0)
    assert outcome.kind == "started_process", (outcome.kind, outcome.message)
    assert "the call started a process" in outcome.message
    assert "no CPU account that counts one" in outcome.message
    assert threaded.kind == "returned", threaded.message  # threads still start


def test_a_worker_whose_filter_is_not_on_is_never_trusted(tmp_path, monkeypatch):
    """Catches a grader that trusts the worker's own word (or nothing) for its filter, as on a
    kernel without seccomp (gVisor may refuse it): the call cannot apply, and says so."""
    monkeypatch.setattr(startup, "seccomp_on", lambda pid: False)
    with student(tmp_path, "none") as process:
        outcome = process.call_alone("threads", [0.1], 60, 30.0)
    assert outcome.kind == "unaccounted", outcome.message
    assert "cannot apply" in outcome.message and "seccomp" in outcome.message


def test_each_mode_has_the_account_it_can_trust(monkeypatch):
    """Catches a cgroup trusted where the student's process runs as the grader's own user
    (it could move itself out), or a TypeScript worker guarded (Node cannot be)."""
    place = cgroups.Home(2, Path("/sys/fs/cgroup/x"), "", "/x")
    monkeypatch.setattr(cgroups, "home", lambda: (place, ""))
    assert account.choose(Sandbox("bwrap"), PYTHON).kind == "cgroup-v2"
    assert account.choose(Sandbox("unprivileged-user"), TYPESCRIPT).kind == "cgroup-v2"
    assert account.choose(Sandbox("none"), PYTHON).kind == "seccomp"
    assert account.choose(Sandbox("none"), TYPESCRIPT).kind == "none"
    monkeypatch.setattr(cgroups, "home", lambda: (None, "cgroupfs is read-only"))
    nothing = account.choose(Sandbox("bwrap"), TYPESCRIPT)
    assert nothing.kind == "none" and "cgroupfs is read-only" in nothing.note
    assert account.choose(Sandbox("none"), PYTHON).note.startswith("CPU account: no cgroup")


MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_graders_own_cgroup_is_found_in_each_hierarchy():
    """Catches a cgroup made outside the grader's own (a sibling of another user's), v1
    preferred to v2, or a hierarchy read from the wrong line."""
    own = "3:cpu,cpuacct:/grading/a\n0::/user.slice/grader.scope\n"
    v2, v1 = cgroups.candidates(own, MOUNTINFO)
    assert (v2.version, v2.path) == (2, Path("/sys/fs/cgroup/unified/user.slice/grader.scope"))
    assert (v1.version, v1.path, v1.hierarchy) == (1, Path("/sys/fs/cgroup/cpuacct/grading/a"),
                                                   "cpu,cpuacct")
    assert cgroups.candidates("0::/\n", "") == []  # nothing mounted (a gVisor sandbox, say)


X32_FORK = """
import ctypes
def x32_fork(_):
    ctypes.CDLL(None).syscall(0x40000000 + 57)  # fork, by its x32 number
    return [1.0]
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 numbers are x86_64's")
def test_a_fork_by_its_x32_number_is_refused_too(tmp_path):
    """Catches a filter that reads only the 64-bit numbers: the x32 one starts a process too."""
    with student(tmp_path, "none") as process:
        (process.course_dir / "tests" / "adapters.py").write_text(textwrap.dedent(X32_FORK))
        outcome = process.call_alone("x32_fork", [0], 60, 30.0)
    assert outcome.kind == "started_process", (outcome.kind, outcome.message)


def test_a_guarded_worker_starts_isolated_from_home(tmp_path):
    """Catches a guarded worker started without -I: a usercustomize.py or .pth the student's
    code left in its user site (HOME, in `--sandbox none` the grader's own; a venv ignores it,
    a system Python does not) would run before the filter, free to fork."""
    import subprocess
    import sys

    from theinference.student import launch

    argv = launch.worker_argv(tmp_path, (3, 4), 2**30, PYTHON, mode="guarded")
    assert argv[-2] == "guarded", argv
    flags = argv[1:next(i for i, a in enumerate(argv) if a.endswith("worker.py"))]
    python = getattr(sys, "_base_executable", sys.executable)  # a venv has no user site
    env = {"HOME": str(tmp_path / "home"), "PATH": os.environ.get("PATH", "")}
    site = subprocess.run([python, "-c", "import site; print(site.getusersitepackages())"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()
    Path(site).mkdir(parents=True)
    ran = tmp_path / "usercustomize-ran"
    (Path(site) / "usercustomize.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    subprocess.run([python, "-c", "pass"], env=env, check=True)
    assert ran.exists(), "this Python runs a user site's usercustomize.py: the check can tell"
    ran.unlink()
    subprocess.run([python, *flags, "-c", "pass"], env=env, check=True)
    assert not ran.exists(), f"the worker's flags {flags} let HOME's usercustomize.py run"


@needs_cgroup
def test_the_cgroup_v1_account_counts_an_unseen_child(tmp_path, monkeypatch):
    """Catches a v1 (cpuacct) account read wrong, or its placement failing, where v2 is not
    writable: the auto-reaped child's CPU is counted there too."""
    cgroup_text = Path("/proc/self/cgroup").read_text()
    homes = cgroups.candidates(cgroup_text, Path("/proc/self/mountinfo").read_text())
    v1 = [h for h in homes if h.version == 1 and not cgroups.probe(h)]
    if not v1:
        pytest.skip("no writable cgroup v1 cpuacct hierarchy here")
    monkeypatch.setattr(cgroups, "home", lambda: (v1[0], ""))
    with student(tmp_path, CGROUP_KIND) as process:
        assert process.cpu_account == "cgroup-v1", process.notes
        outcome = process.call_alone("auto_reaped", [0.4], 60, 30.0)
    assert outcome.kind == "returned", outcome.message
    assert 0.32 <= outcome.cpu_seconds <= 1.5, outcome.cpu_seconds


FORKED = [c for c in CHEATS if c["id"].endswith("-forked-unseen")]


# (cheat, timeout, mode): both cheats at 3600 s under the cgroup here (stopped by the budget,
# well inside their stage's own timeout); one under a seccomp-guarded worker, which fails it at
# its first fork whatever the timeout
FORKED_RUNS = [
    *[(c, 3600, "auto") for c in FORKED],
    (FORKED[0], "the stage's own", "none"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cheat", "timeout", "mode"), FORKED_RUNS, ids=[f"{c['id']}-{t}-{m}" for c, t, m in FORKED_RUNS]
)
def test_a_recompute_in_children_nobody_waits_for_fails_by_the_proof(
    cheat, timeout, mode, tmp_path, weights, monkeypatch
):
    """Catches a recompute whose every forward runs in a short-lived forked child with SIGCHLD
    ignored (its CPU in no process's counters) passing the floor, or failing only by a
    timeout: the cgroup counts it and stops it at the budget; a guarded worker may not fork."""
    from theinference.grading.grader import RunPlan, grade

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # what the student's code may write
    (tmp_path / "home").mkdir()
    course = make_course(tmp_path / "c", reference_text() + cheat["code"])
    (own,) = [s.timeout for s in load_stages() if s.slug == cheat["stage"]]
    seconds = own if timeout == "the stage's own" else float(timeout)
    # its proof case made small (tests/test_cache_use.py): stopped at its budget in seconds
    stage = replace(proof_stage(cheat["stage"], small=True), timeout=seconds)
    chosen = sandbox.choose(mode)
    setup = ProcessSetup(course, weights.path, Limits(timeout=seconds), sandbox=chosen)
    started = time.monotonic()
    run = grade(setup, RunPlan([stage], weights))
    (result,) = run.stages[0].cases
    assert result.status == Status.FAILED, (result.status, result.message)
    said = "the call started a process" if chosen.kind == "none" else "recompute"
    assert said in result.message, result.message
    assert time.monotonic() - started < own  # stopped as it would be at the stage's timeout
