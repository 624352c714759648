"""Every process the student's code starts is found and killed, however it detaches.

The grader makes itself a child subreaper (PR_SET_CHILD_SUBREAPER): a process that double-forks,
calls setsid or re-executes itself with a clean environment is re-parented to the grader, not
to init, so it stays in the tree cpu.py measures. At the end of every call every process of the
tree but the worker itself (and bwrap's own two) is killed; when the worker stops, all of them.

A process that changes pid every few milliseconds (fork, the parent exits) can be between two
pids while the tree is read: one look may find nothing. So where the worker has a cgroup v2 of
its own, the sweep reads its member list (in which a forking process's child is added behind
it) and, when it holds more than the worker, freezes it (nothing in it can fork then) and kills
all but the worker; elsewhere the looks go on until several in a row find nothing, and a call
that left a process stops the worker. A uid of the student's own (identity.py) is emptied
whole when its worker stops: kill(-1) sent by a process of that uid reaches every process of
it in one pass of the kernel, and a fork racing it fails.
The grader reaps only the processes it killed or found ended under it, by pid: never
waitpid(-1), which would take the worker's exit status from its Popen.
"""

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from theinference.student import cpu
from theinference.student.cpu import WORKER_ROOTS, Stat, process_table, tree_table

PR_SET_CHILD_SUBREAPER = 36
KILL_ROUNDS = 100  # a process forking as fast as it can is outrun in a few
QUIET_LOOKS = 3  # looks in a row that find nothing before a tree is taken as empty
LOOK_GAP = 0.003  # seconds between them: a process hopping pids is settled in one of them
REAP_WAIT = 2.0  # seconds for a killed process to become a zombie (it may be in a syscall)


@functools.cache
def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans; False where that cannot be
    had (not Linux), and then only the process group, the token and bwrap hold the tree."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        cpu.SUBREAPER = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        cpu.SUBREAPER = False
    return cpu.SUBREAPER


def kill_tree(
    root: int,
    since: int,
    keep: frozenset[int] = frozenset(),
    uid: int | None = None,
    looks: int = QUIET_LOOKS,
) -> bool:
    """SIGKILL every live process of root's tree (cpu.tree_members) but `keep`, and every
    process running as `uid` (a uid of the student's own), until `looks` looks in a row find
    none; then reap those that are the grader's children. A process that forks while it is
    killed is found in a next look: its child is still in the tree. Whether any was found."""
    quiet, found = 0, False
    for _ in range(KILL_ROUNDS):
        table = tree_table(root, since)
        if uid is not None:
            everything = process_table()
            table |= {pid: everything[pid] for pid in running_as(uid, everything)}
        victims = {pid for pid, stat in table.items() if stat.state not in "ZX"} - keep
        # a process that ended under the grader since the last look may have left a child the
        # kernel re-parented after this look read the grader's children: not a quiet look
        ended = reap_ended(table, root, keep)
        if not victims:
            quiet = 0 if ended else quiet + 1
            if quiet >= looks:
                break
            time.sleep(LOOK_GAP)
            continue
        quiet, found = 0, True
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    reap_orphans(root, since, keep)
    return found


def end_of_call(root: int, since: int, keep: frozenset[int], cgroup=None, uid=None) -> bool:
    """Kill everything the call started but the worker (`keep`): exactly where the worker has
    a cgroup that can be read and frozen (cgroups.Cgroup: `emptied`); else from looks at its
    tree, which a process hopping pids faster than a look may outrun. True when that could be
    so (no such cgroup, and a process was found): the caller then stops the worker, whose stop
    is exact where the sandbox gives a way (the uid emptied, bwrap's PID namespace)."""
    contained = cgroup is not None and emptied(cgroup, keep)
    found = kill_tree(root, since, keep, looks=1 if contained else QUIET_LOOKS)
    return not contained and (found or uid_holds_more(uid, keep))


def emptied(cgroup, keep: frozenset[int]) -> bool:
    """Whether the cgroup now holds nothing but `keep`: read in one pass of the kernel's list,
    where a child is added behind the process that forks it (so a process hopping pids always
    has one of its pids listed); where it holds more, frozen (nothing in it can fork) and all
    but `keep` killed. False where it cannot be read or frozen, or does not hold the worker."""
    try:
        members = cgroup.members()
    except (OSError, ValueError):
        return False
    if not keep <= members:  # the worker is not in it (it could not join): it holds nothing
        return False
    if not members - keep:
        return True
    if not cgroup.freeze():
        return False
    try:
        cgroup.kill_but(keep)
    finally:
        cgroup.thaw()
    return True


def uid_holds_more(uid: int | None, keep: frozenset[int]) -> bool:
    """Where the worker runs as a uid of its own: whether a live process of that uid is not the
    worker's, in a few looks at /proc by uid rather than by tree (an orphan that hops pids has
    left the tree, never the uid; each look lists pids in rising order, and a hop's new pid
    lies ahead of it). The caller then stops the worker, which empties the uid."""
    if uid is None:
        return False
    for _ in range(QUIET_LOOKS):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) not in keep and _live_of(entry, uid):
                return True
    return False


def _live_of(entry, uid: int) -> bool:
    try:
        if entry.stat().st_uid != uid:
            return False
        with open(os.path.join(entry.path, "stat"), "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie holds no CPU
    except (OSError, IndexError):
        return False


KILL_ALL = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass"


def empty_uid(uid: int | None) -> None:
    """SIGKILL every process running as `uid` (None: the grader's own user, or bwrap's: none
    of this), from a process of that uid (kill(-1) spares only the sender): the kernel signals
    them all in one pass, and a fork that races it fails, so nothing of the uid is left to
    run. /bin/kill where there is one (a fast start), else this Python."""
    if uid is None:
        return
    program = shutil.which("kill", path="/usr/bin:/bin")
    argv = [program, "-9", "-1"] if program else [sys.executable, "-I", "-S", "-c", KILL_ALL]
    try:
        subprocess.run(argv, user=uid, group=uid, extra_groups=[], env={}, cwd="/",
                       capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        pass  # the looks of kill_tree still ran


def reap_ended(table: dict[int, Stat], root: int, keep: frozenset[int]) -> int:
    """Wait for the ended processes of a look that are the grader's own children (re-parented
    to it): a process hopping pids leaves one per hop, and a look that reads hundreds of them
    is slow enough for the live one to hop past it unseen. How many were reaped."""
    ended = {pid for pid in grader_orphans(table, root, keep) if table[pid].state in "ZX"}
    return sum(reaped(pid) is True for pid in ended)


def reap_orphans(root: int, since: int, keep: frozenset[int]) -> None:
    """Wait for every process of the tree that is now the grader's own child (re-parented to
    it) and not the worker's root: it was killed above, or ended by itself."""
    reap_all(grader_orphans(tree_table(root, since), root, keep))


def reap_all(pids: set[int]) -> None:
    """Wait (up to REAP_WAIT) for each of pids that is the grader's child to end: a bwrap
    probe's PID 1 too (bwrap_probe.bwrap_ran), a zombie until the grader exits otherwise."""
    deadline = time.monotonic() + REAP_WAIT
    waiting = set(pids)
    while waiting:
        waiting = {pid for pid in waiting if reaped(pid) is False}  # None: not ours (any more)
        if not waiting or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def grader_orphans(table: dict[int, Stat], root: int, keep: frozenset[int]) -> set[int]:
    """The processes of a look that are the grader's own children (re-parented to it), never
    the worker's root, `keep`, or another student process's root (its Popen waits for it)."""
    grader, spared = os.getpid(), keep | {root} | WORKER_ROOTS
    return {pid for pid, stat in table.items() if stat.ppid == grader and pid not in spared}


def reaped(pid: int) -> bool | None:
    """Wait for pid without blocking: True when it had ended, False while it runs, None when it
    is not the grader's child (any more)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return None


def running_as(uid: int | None, table: dict[int, Stat]) -> set[int]:
    """The processes whose real or effective uid is `uid` (none when uid is None)."""
    if uid is None:
        return set()
    found = set()
    for pid in table:
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
        except OSError:
            continue
        line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        if str(uid) in line.split()[1:3]:
            found.add(pid)
    return found


def worker_chain(root: int, wrapper: str | None, depth: int = 3) -> tuple[int, ...]:
    """root and the first-started process of each level below it, down to the first that is
    not `wrapper` (None: root is the worker): under bwrap, its outer process, its PID
    namespace's init and the worker, which the end-of-call sweep spares."""
    chain, pid = [root], root
    for _ in range(depth if wrapper is not None else 0):
        if program(pid) != wrapper:
            break
        table = process_table()
        children = [p for p, s in table.items() if s.ppid == pid]
        if not children:
            break
        pid = min(children, key=lambda p: (table[p].start, p))
        chain.append(pid)
    return tuple(chain)


def program(pid: int) -> str:
    """The name of the program pid runs (its argv[0]'s last part), "" when unreadable."""
    try:
        argv0 = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return ""
    return os.path.basename(argv0.decode(errors="replace"))


def kill_tagged(token_var: str, token: str) -> None:
    """SIGKILL every process whose environment carries this run's token (Linux /proc): a
    second net, for a process that left the tree while the grader was not a subreaper."""
    needle = f"{token_var}={token}".encode()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone already, or not ours to read
