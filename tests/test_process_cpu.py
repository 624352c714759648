"""The grader's own measure of the student's CPU time, read from /proc outside their process."""

import os
import textwrap
from pathlib import Path

import pytest

from theinference.student import sandbox
from theinference.student.cpu import CpuTime, cpu_seconds_between
from theinference.student.process import StudentProcess
from theinference.student.sandbox import Sandbox
from theinference.student.setup import Limits, ProcessSetup

BUSY = """
import subprocess, sys, threading, time

def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(20000))  # arithmetic: user time, as a recompute's
    return [1.0]

def threads(seconds):
    workers = [threading.Thread(target=spin, args=(seconds,)) for _ in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return [1.0]

def child(seconds):
    code = f"import time\\nend = time.process_time() + {seconds}\\n"
    code += "while time.process_time() < end: sum(range(20000))"
    subprocess.run([sys.executable, "-c", code], check=True)
    return [1.0]

def nap(seconds):
    time.sleep(seconds)
    return [1.0]

def touch(seconds):
    # fresh pages, written once: their page faults are kernel time
    end = time.process_time() + seconds
    while time.process_time() < end:
        pages = bytearray(64 << 20)
        pages[::4096] = bytes(len(pages[::4096]))
        del pages
    return [1.0]
"""

# (adapter, CPU seconds it truly burns for an argument of 0.4)
TRUTH = [("spin", 0.4), ("threads", 0.8), ("child", 0.4), ("nap", 0.0)]


def course_with_busy_loops(root: Path) -> Path:
    for folder in ("tests", "src"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "tests" / "adapters.py").write_text(textwrap.dedent(BUSY))
    os.chmod(root, 0o755)  # bwrap binds it as is; the unprivileged user must read it
    return root


SANDBOXES = [
    "none",
    pytest.param(
        "bwrap",
        marks=pytest.mark.skipif(bool(sandbox.bwrap_problem()), reason="bubblewrap unusable"),
    ),
]


@pytest.mark.parametrize("kind", SANDBOXES)
def test_the_outside_measure_of_a_busy_loop_is_within_a_factor_of_its_truth(kind, tmp_path):
    """Catches CPU time read as wall time (a sleep costs nothing), threads or child processes
    left out of the count, or, under bwrap, the worker (a descendant of bwrap) not found."""
    course = course_with_busy_loops(tmp_path / "c")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    with StudentProcess(ProcessSetup(
            course, weights, Limits(timeout=60), sandbox=Sandbox(kind))) as process:
        for adapter, truth in TRUTH:
            outcome = process.call(adapter, [0.4])
            assert outcome.kind == "returned", outcome.message
            if truth:
                assert truth / 2 <= outcome.cpu_seconds <= truth * 2, (adapter, outcome)
            else:
                assert outcome.cpu_seconds < 0.1, (adapter, outcome)


def test_a_process_never_gives_back_time_it_used():
    """Catches a process that left the tree (or ended unseen) lowering the count: the student
    could burn CPU in a helper before the call and send it away during it."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    before = {(10, 1): (500, 50), (11, 1): (100, 10)}
    after = {(10, 1): (520, 45)}  # 11 left; 10 used 20 more ticks (its kernel's read lower)
    assert cpu_seconds_between(before, after) == pytest.approx((20 * tick, 0))
    reused_pid = {(10, 2): (30, 3)}  # pid 10 again, a new process: all of its ticks are new
    assert cpu_seconds_between(before, reused_pid) == pytest.approx((30 * tick, 3 * tick))


def test_kernel_time_is_charged_only_past_a_share_of_the_limit():
    """Catches a limited call charged its whole kernel time (a correct cache's page faults,
    whose cost the host sets, swing its CPU time several-fold and fail it at its floor), and
    one charged its user time alone (a recompute a tick-sampled kernel files as its own would
    escape any floor)."""
    # a slow correct cache's prefill before its swap: a steady 1 s of user time, and kernel
    # time measured from 0.5 to 1.9 s from one run to the next (2.9: a host slower still),
    # under the 3.63 s limit a run failed it at
    faulting_cache = CpuTime(user=1.0, kernel=2.9)
    assert sum(faulting_cache) > 3.63 > faulting_cache.charged(3.63)
    assert CpuTime(user=1.0, kernel=1.4).charged(3.63) == pytest.approx(1.0)
    floor = 6.0
    recompute_as_kernel_time = CpuTime(user=0.0, kernel=floor)
    assert recompute_as_kernel_time.charged(0.6 * floor) > 0.6 * floor
    assert CpuTime(user=1.0, kernel=2.0).charged(None) == pytest.approx(3.0)  # unlimited: all


@pytest.mark.parametrize("kind", SANDBOXES)
def test_the_outside_measure_tells_kernel_time_from_user_time(kind, tmp_path):
    """Catches an account (a cgroup's, or /proc's) read as one figure, user and kernel time
    together: a call that spends its time in page faults would then be charged for all of
    them under a limit."""
    course = course_with_busy_loops(tmp_path / "c")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    with StudentProcess(ProcessSetup(
            course, weights, Limits(timeout=60), sandbox=Sandbox(kind))) as process:
        whole = process.call("touch", [0.5])
        assert whole.kind == "returned" and whole.cpu_seconds >= 0.4, (whole.message, whole)
        # measured alone: read from its cgroup where the run has a cgroup account (bwrap)
        limited = process.call_alone("touch", [0.5], 60, 100.0)  # forgives 40 s of kernel time
        assert limited.kind == "returned", limited.message
        assert limited.cpu_seconds < 0.6 * whole.cpu_seconds, (limited, whole)


@pytest.mark.parametrize("kind", SANDBOXES)
def test_a_call_over_its_cpu_limit_is_killed_and_says_so(kind, tmp_path):
    """Catches a CPU limit that is not enforced (the spin would run to the 60 s timeout), one
    that forgets the CPU of a child process or of threads, a message without the limit's
    figure, a call under its limit stopped, or a process not restarted after the kill."""
    course = course_with_busy_loops(tmp_path / "c")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    with StudentProcess(ProcessSetup(
            course, weights, Limits(timeout=60), sandbox=Sandbox(kind))) as process:
        for adapter in ("spin", "threads", "child"):
            outcome = process.call(adapter, [30.0], cpu_limit=0.5)
            assert outcome.kind == "cpu_limit", (adapter, outcome.kind, outcome.message)
            assert outcome.message == (
                "used more than 0.5 CPU-seconds, the limit for this call; the process was killed"
            )
            assert 0.5 < outcome.cpu_seconds < 5, (adapter, outcome.cpu_seconds)
            assert outcome.seconds < 20, (adapter, outcome.seconds)  # not the 60 s timeout
        under = process.call("spin", [0.2], cpu_limit=2.0)
        assert under.kind == "returned" and under.cpu_seconds < 2.0, under.message
        asleep = process.call("nap", [1.0], cpu_limit=0.3)  # wall time is not CPU time
        assert asleep.kind == "returned", asleep.message
        assert process.startups == 4  # a fresh process after each of the three kills
