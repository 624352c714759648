"""Limits watched from outside while an adapter call runs: the CPU time the student's process
has used since the call started (its cgroup's account, cgroups.py, or its /proc tree, cpu.py;
its kernel time charged past a share of the limit only: cpu.KERNEL_SHARE), and the memory its
tree holds. Read by the grader, so nothing the student's code does can hide
from it.

Memory is the tree's anonymous and shared resident memory (RssAnon + RssShmem of every process:
heap, private mappings, and MAP_SHARED|MAP_ANONYMOUS or mapped tmpfs pages, which RLIMIT_DATA
does not see), plus what the student's files hold in memory-backed folders (`files()`: bwrap's
private /tmp, HOME and /dev/shm, or a dropped uid's files in the host's tmpfs folders).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from theinference.student.cpu import CpuTime

CHECK_EVERY = 0.1  # seconds between two looks at /proc: a few ms of the grader's time each
FILES_EVERY = 0.5  # files are counted less often: a folder walk costs more
MEMORY_FIELDS = ("RssAnon:", "RssShmem:")  # kB in /proc/<pid>/status


@dataclass(frozen=True)
class Breach:
    """A limit the call went over: the outcome's kind, its message and the CPU time used."""

    kind: str
    message: str
    cpu_seconds: float | None = None


@dataclass
class Watchdog:
    """Looks at the call's process tree every CHECK_EVERY seconds (when polled), and says when
    a limit is broken. `look` gives the CPU time used since the call started and the tree's
    live pids now; `files` the bytes its files hold in memory-backed folders."""

    look: Callable[[], tuple[CpuTime, set[int]]]
    cpu_limit: float | Callable[[], float | None] | None = None  # a callable: None, none yet
    memory_limit: int | None = None
    files: Callable[[], int] = lambda: 0
    lifted: Callable[[], bool] = lambda: False  # the CPU limit no longer applies (Probe.swapped)
    next_look: float = 0.0
    file_bytes: int = 0  # the last count of `files`, and when it is due again
    next_files: float = 0.0

    def __post_init__(self):
        self.next_look = time.monotonic() + CHECK_EVERY

    def poll(self) -> Breach | None:
        """A breach, when it is time to look and a limit is broken; else None."""
        now = time.monotonic()
        if (self.cpu_limit is None and self.memory_limit is None) or now < self.next_look:
            return None
        self.next_look = now + CHECK_EVERY
        cpu_time, pids = self.look()
        cpu_limit = self.limit_now()  # read once: the limit charged against is the one compared
        used = cpu_time.charged(cpu_limit)  # as `charged` does
        if cpu_limit is not None and used > cpu_limit and not self.lifted():
            return cpu_breach(cpu_limit, used)
        if self.memory_limit is not None:
            if now >= self.next_files:
                self.file_bytes, self.next_files = self.files(), now + FILES_EVERY
            held = sum(map(resident_bytes, pids)) + self.file_bytes
            if held > self.memory_limit:
                return memory_breach(self.memory_limit, held, used)
        return None

    def limit_now(self) -> float | None:
        return self.cpu_limit() if callable(self.cpu_limit) else self.cpu_limit

    def charged(self, cpu_time: CpuTime) -> float:
        """The seconds the call is charged for `cpu_time` under its limit: its kernel time in
        part only (cpu.KERNEL_SHARE)."""
        return cpu_time.charged(self.limit_now())


def resident_bytes(pid: int) -> int:
    """RssAnon + RssShmem of one process, in bytes (0 when gone, or a zombie)."""
    try:
        lines = (Path("/proc") / str(pid) / "status").read_text().splitlines()
    except OSError:
        return 0
    return sum(int(ln.split()[1]) * 1024 for ln in lines if ln.startswith(MEMORY_FIELDS))


def cpu_breach(limit: float, used: float) -> Breach:
    message = (
        f"used more than {limit:g} CPU-seconds, the limit for this call; the process was killed"
    )
    return Breach("cpu_limit", message, used)


def memory_breach(limit: int, held: int, used: float) -> Breach:
    message = (
        f"MemoryError: the code held {held / 2**30:.2f} GiB of memory, over the grader's limit: "
        f"{limit / 2**30:g} GiB (heap, shared memory and files in memory-backed folders such "
        "as /tmp count); the process was killed"
    )
    return Breach("memory_limit", message, used)
