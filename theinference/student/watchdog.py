"""Limits watched from outside while an adapter call runs: the CPU time the student's process
tree has used since the call started. Read from /proc by the grader, like the CPU measure
itself (cpu.py), so nothing the student's code does can hide from it or lower it."""

import time
from collections.abc import Callable
from dataclasses import dataclass

from theinference.student.cpu import Snapshot, cpu_seconds_between

CHECK_EVERY = 0.1  # seconds between two looks at /proc: a few ms of the grader's time each


@dataclass(frozen=True)
class Breach:
    """A limit the call went over: the outcome's kind, its message and the CPU time used."""

    kind: str
    message: str
    cpu_seconds: float | None = None


class Watchdog:
    """Looks at the call's process tree every CHECK_EVERY seconds (when polled), and says when
    a limit is broken. `snapshot` reads the tree's CPU ticks now (cpu.tree_cpu for the call)."""

    def __init__(self, snapshot: Callable[[], Snapshot], before: Snapshot, cpu_limit: float | None):
        self.snapshot = snapshot
        self.before = before
        self.cpu_limit = cpu_limit
        self.next_look = time.monotonic() + CHECK_EVERY

    def poll(self) -> Breach | None:
        """A breach, when it is time to look and a limit is broken; else None."""
        now = time.monotonic()
        if self.cpu_limit is None or now < self.next_look:
            return None
        self.next_look = now + CHECK_EVERY
        used = cpu_seconds_between(self.before, self.snapshot())
        if used > self.cpu_limit:
            return cpu_breach(self.cpu_limit, used)
        return None


def cpu_breach(limit: float, used: float) -> Breach:
    message = (
        f"used more than {limit:g} CPU-seconds, the limit for this call; the process was killed"
    )
    return Breach("cpu_limit", message, used)
