"""The grader's own measure of the student's CPU time, read from /proc outside their process."""

import os
import textwrap
from pathlib import Path

import pytest

from theinference.student import sandbox
from theinference.student.cpu import cpu_seconds_between
from theinference.student.process import StudentProcess
from theinference.student.sandbox import Sandbox
from theinference.student.setup import Limits, ProcessSetup

BUSY = """
import subprocess, sys, threading, time

def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
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
    code += "while time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
    return [1.0]

def nap(seconds):
    time.sleep(seconds)
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
    before = {(10, 1): 500, (11, 1): 100}
    after = {(10, 1): 520}  # 11 left; 10 used 20 more ticks
    assert cpu_seconds_between(before, after) == pytest.approx(20 / os.sysconf("SC_CLK_TCK"))
    reused_pid = {(10, 2): 30}  # pid 10 again, a new process: all of its ticks are new
    assert cpu_seconds_between(before, reused_pid) == pytest.approx(30 / os.sysconf("SC_CLK_TCK"))


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
