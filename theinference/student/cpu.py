"""The CPU time of the student's process tree, read by the grader from /proc (Linux).

Measured from outside because anything measured inside the student's process (time.process_time,
a probe in the worker) is theirs to forge. A process's utime and stime count all its threads,
living or ended; cutime and cstime count its children that have ended and been waited for. The
tree is every process whose session is the one the grader started, or that descends from the
process the grader started (under bubblewrap, the worker is a descendant of bwrap in its own
session). A process that leaves both, and the tree's own work done before it left, is not
counted: under bubblewrap's PID namespace no process can leave the tree.
"""

import os
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")

Snapshot = dict[tuple[int, int], int]  # (pid, start time) -> clock ticks used so far


def read_stat(pid: int) -> tuple[int, int, int, int] | None:
    """(parent pid, session id, start time, ticks used by it and its waited-for children), or
    None when the process is gone or unreadable."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields follow its last ")"
    fields = text[text.rfind(")") + 2 :].split()
    try:
        # fields[0] is field 3 (state): ppid 4, session 6, utime..cstime 14-17, starttime 22
        ppid, session, start = int(fields[1]), int(fields[3]), int(fields[19])
        ticks = sum(int(f) for f in fields[11:15])
    except (IndexError, ValueError):
        return None
    return ppid, session, start, ticks


def tree_cpu(root: int) -> Snapshot:
    """Ticks used so far by every live process in root's session or below root."""
    stats = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    return {
        (pid, start): ticks
        for pid, (_, session, start, ticks) in stats.items()
        if session == root or descends_from(pid, root, stats)
    }


def descends_from(pid: int, root: int, stats: dict) -> bool:
    seen = set()
    while pid not in seen and pid in stats:
        if pid == root:
            return True
        seen.add(pid)
        pid = stats[pid][0]
    return False


def cpu_seconds_between(before: Snapshot, after: Snapshot) -> float:
    """CPU seconds the tree used between two snapshots. Each process counts only what it
    gained, never less than nothing: a process that left (or ended) cannot take back time,
    and one that ended and was waited for shows up in its parent's children's ticks."""
    gained = sum(max(ticks - before.get(key, 0), 0) for key, ticks in after.items())
    return gained / TICKS_PER_SECOND
