"""The student's process tree and its CPU time, read by the grader from /proc (Linux).

Measured from outside because anything measured inside the student's process (time.process_time,
a probe in the worker) is theirs to forge. A process's utime and stime count all its threads,
living or ended; cutime and cstime count its children that have ended and been waited for.

The tree is every process whose session is the one the grader started, or that descends from the
process the grader started (under bubblewrap, the worker is a descendant of bwrap in its own
session), or that was re-parented to the grader after the worker started: the grader is a child
subreaper (reaper.py), so a process that double-forks, calls setsid or re-executes itself with a
clean environment lands under the grader instead of init, and stays in the tree. Its work is
counted while it runs and while it waits, a zombie, for the grader to reap it after the call.
Under bubblewrap's PID namespace no process can leave the tree at all.

What this cannot see: a child that ended and was reaped by the kernel, not waited for (its
parent ignores SIGCHLD). Where the run has a cgroup account (cgroups.py, account.py) the
worker's CPU is read from it instead; a measured call without one runs forbidden to start a
process at all.
"""

import os
import threading
from pathlib import Path
from typing import NamedTuple

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")

Snapshot = dict[tuple[int, int], tuple[int, int]]  # (pid, start) -> (user, kernel) ticks so far
WORKER_ROOTS: set[int] = set()  # every live worker's root pid: the grader's own children
# held while a worker starts, until its root is in WORKER_ROOTS: a look in another thread (the
# end of a call beside it) would meanwhile take the starting worker for what that call left
STARTING = threading.RLock()


# kernel time a limited call is not charged for, as a share of its limit. A call's kernel time
# is mostly page faults, whose cost the host sets: 10-45 us each here, moving several-fold from
# one run of the same code to the next (a correct cache's prefill: 0.5 s to 1.9 s of it beside
# a steady 1 s of user time), where a recompute's arithmetic is all user time. Past this share
# it counts: a kernel whose accounts are sampled at its timer tick can be steered into filing a
# process's work as the kernel's, and such a recompute gains at most this much (a floor's 0.6
# becomes 0.84, still under the floor)
KERNEL_SHARE = 0.4


class CpuTime(NamedTuple):
    """CPU seconds in user mode and in the kernel (page faults, system calls)."""

    user: float = 0.0
    kernel: float = 0.0

    def since(self, start: "CpuTime") -> "CpuTime":
        return CpuTime(self.user - start.user, self.kernel - start.kernel)

    def charged(self, limit: float | None) -> float:
        """The seconds a call under `limit` is charged: its user time, and its kernel time
        past KERNEL_SHARE of the limit; all of it where there is no limit."""
        allowance = KERNEL_SHARE * limit if limit else 0.0
        return self.user + max(self.kernel - allowance, 0.0)


class Stat(NamedTuple):
    ppid: int
    session: int
    start: int  # clock ticks after boot: with the pid, names one process
    ticks: tuple[int, int]  # (user, kernel) used by it and its waited-for children
    state: str  # R, S, D, Z (a zombie: ended, not yet reaped), ...


def read_stat(pid: int) -> Stat | None:
    """The process's /proc stat fields, or None when it is gone or unreadable."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields follow its last ")"
    fields = text[text.rfind(")") + 2 :].split()
    try:
        # fields[0] is field 3 (state): ppid 4, session 6, utime..cstime 14-17, starttime 22
        ppid, session, start = int(fields[1]), int(fields[3]), int(fields[19])
        utime, stime, cutime, cstime = map(int, fields[11:15])
    except (IndexError, ValueError):
        return None
    return Stat(ppid, session, start, (utime + cutime, stime + cstime), fields[0])


def process_table() -> dict[int, Stat]:
    """Every readable process on the machine, by pid."""
    table = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    return table


def tree_members(root: int, table: dict[int, Stat], since: int | None = None) -> set[int]:
    """The pids of root's tree: its session, its descendants, and (when `since`, root's start
    time, is given) every process under a child of this grader that started after root and is
    not root: what the student's code left behind that the kernel re-parented to the grader."""
    grader = os.getpid()
    members = set()
    for pid, stat in table.items():
        if pid == grader:
            continue
        top = top_below(pid, grader, table)
        orphan = (
            since is not None
            and top is not None
            and top != root
            and table[top].start >= since
            and top not in WORKER_ROOTS
        )
        if stat.session == root or orphan or descends_from(pid, root, table):
            members.add(pid)
    return members


def top_below(pid: int, ancestor: int, table: dict[int, Stat]) -> int | None:
    """The child of `ancestor` that `pid` descends from (pid itself when it is one), or None."""
    seen = set()
    while pid not in seen and pid in table:
        seen.add(pid)
        if table[pid].ppid == ancestor:
            return pid
        pid = table[pid].ppid
    return None


def tree_cpu(root: int, since: int | None = None) -> Snapshot:
    """Ticks used so far by every process of root's tree (tree_members)."""
    return tree_look(root, since)[0]


def tree_look(root: int, since: int | None = None) -> tuple[Snapshot, set[int]]:
    """The tree's ticks so far (tree_cpu) and its live processes' pids, from one look."""
    table = tree_table(root, since)
    ticks = {(pid, stat.start): stat.ticks for pid, stat in table.items()}
    return ticks, {pid for pid, stat in table.items() if stat.state not in "ZX"}


def tree_table(root: int, since: int | None = None) -> dict[int, Stat]:
    """The stat of every process of root's tree (tree_members). Where the grader is a
    subreaper, every process of the tree descends from root or from one of the grader's own
    children, so following the kernel's child lists from those finds it all, reading a few
    files instead of every process's on the machine (a look every 0.1 s stays cheap)."""
    if not (SUBREAPER and CHILD_LISTS):
        with STARTING:
            table = process_table()
            return {pid: table[pid] for pid in tree_members(root, table, since)}
    tops = [root]
    if since is not None:
        with STARTING:
            for pid in children(os.getpid()):
                stat = read_stat(pid)
                if pid != root and pid not in WORKER_ROOTS and stat and stat.start >= since:
                    tops.append(pid)
    found: dict[int, Stat] = {}
    while tops:
        pid = tops.pop()
        if pid not in found and (stat := read_stat(pid)) is not None:
            found[pid] = stat
            tops += children(pid)
    return found


SUBREAPER = False  # set by reaper.become_subreaper: orphans then come to the grader
CHILD_LISTS = (PROC / "thread-self" / "children").exists()  # CONFIG_PROC_CHILDREN


def children(pid: int) -> list[int]:
    """The pids of pid's children, from /proc/<pid>/task/<tid>/children (every thread's)."""
    kids: list[int] = []
    try:
        for task in (PROC / str(pid) / "task").iterdir():
            kids += map(int, (task / "children").read_text().split())
    except (OSError, ValueError):
        pass
    return kids


def descends_from(pid: int, root: int, stats: dict) -> bool:
    seen = set()
    while pid not in seen and pid in stats:
        if pid == root:
            return True
        seen.add(pid)
        pid = stats[pid][0]
    return False


def cpu_seconds_between(before: Snapshot, after: Snapshot) -> CpuTime:
    """CPU time the tree used between two snapshots. Each process counts only what it
    gained, never less than nothing: a process that left (or ended) cannot take back time,
    and one that ended and was waited for shows up in its parent's children's ticks."""
    user = kernel = 0
    for key, (user_now, kernel_now) in after.items():
        user_then, kernel_then = before.get(key, (0, 0))
        user += max(user_now - user_then, 0)
        kernel += max(kernel_now - kernel_then, 0)
    return CpuTime(user / TICKS_PER_SECOND, kernel / TICKS_PER_SECOND)
