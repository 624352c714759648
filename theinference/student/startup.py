"""How a student worker starts, and where its CPU time is read: spawned (in its cgroup from its
first instruction where the run's account is one, cgroups.py), placed whole and checked, or
confirmed guarded (worker/guard.py), before the grader lets the student's code load.
"""

import fcntl
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from theinference.student import account as accounts
from theinference.student import sandbox
from theinference.student.account import Account
from theinference.student.cgroups import Cgroup
from theinference.student.cpu import (
    STARTING,
    WORKER_ROOTS,
    CpuTime,
    cpu_seconds_between,
    read_stat,
    tree_cpu,
    tree_look,
    tree_table,
)
from theinference.student.replies import Outcome
from theinference.student.worker.protocol import LENGTH

STARTUP_TIMEOUT = 60.0  # a cold interpreter and NumPy import on a loaded machine
PLACING_ROUNDS = 50  # looks at the fresh tree until every process of it is in its cgroup
GO = LENGTH.pack(2) + b"{}"  # the grader's go: the student's code may load now
Look = Callable[[], tuple[CpuTime, set[int]]]  # CPU time since the call began, live pids


@dataclass
class Worker:
    popen: subprocess.Popen
    requests: int  # fd the grader writes requests to
    replies: int  # fd the grader reads replies from
    since: int = 0  # the root's start time (clock ticks): what started later under us is its
    keep: frozenset[int] = frozenset()  # the worker and, under bwrap, bwrap's own processes
    worker: int = 0  # the worker's pid (under bwrap, inside the sandbox, seen from outside)
    outgoing: bytearray = field(default_factory=bytearray)  # request bytes not yet taken
    cgroup: Cgroup | None = None  # its own cgroup, removed when it stops
    counted: bool = False  # every process of its tree was placed in that cgroup
    guarded: bool = False  # started with starting a process forbidden (worker/guard.py)
    unaccounted: str = ""  # why a measured call in it cannot be trusted ("" when it can)

    @property
    def root(self) -> int:
        return self.popen.pid


PIPE_BYTES = 1 << 20  # Linux's default most for an unprivileged process (pipe-max-size)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def widen(fd: int) -> None:
    """The reply pipe made 1 MiB wide where the system allows: the arrays a swap's moment sends
    (hundreds of MB at a prefill's layer) cross in 16 times fewer turns of the two processes,
    twice as fast here. Where it cannot (another system, a lower limit), the default pipe
    serves, slower."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


def spawn(command: Callable, account: Account, guarded: bool) -> Worker | Outcome:
    """The worker's process, started by `command(request_fd, reply_fd)` (argv, env, user,
    folder), in a fresh cgroup where the run's account is one; or why it could not start."""
    cgroup = new_cgroup(account)
    req_read, req_write = os.pipe()
    resp_read, resp_write = os.pipe()
    widen(resp_read)
    joining = os.open(cgroup.procs, os.O_WRONLY) if cgroup is not None else None
    try:
        argv, env, as_user, cwd = command(req_read, resp_write)
        popen = started(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(req_read, resp_write),  # bwrap hands inherited descriptors on as is
            start_new_session=True,  # its own process group, killed whole
            preexec_fn=None if joining is None else lambda: join_cgroup(joining),
            **as_user,
        )
    except OSError as exc:
        for fd in (req_read, req_write, resp_read, resp_write):
            os.close(fd)
        if cgroup is not None:
            cgroup.remove()
        message = f"the student's process could not start: {exc.strerror or exc}"
        return Outcome("crashed", message=message)
    finally:
        if joining is not None:
            os.close(joining)
    os.close(req_read)
    os.close(resp_write)
    os.set_blocking(req_write, False)  # written as it drains: see channel.py
    stat = read_stat(popen.pid)
    since = stat.start if stat is not None else 0
    worker = Worker(popen=popen, requests=req_write, replies=resp_read, since=since)
    worker.cgroup, worker.guarded = cgroup, guarded
    return worker


def started(argv: list[str], **popen_options) -> subprocess.Popen:
    """subprocess.Popen, its pid in WORKER_ROOTS before a look in another thread can see it
    (cpu.STARTING): until then, it would be taken for what a call beside it left behind."""
    with STARTING:
        popen = subprocess.Popen(argv, **popen_options)
        WORKER_ROOTS.add(popen.pid)
    return popen


def new_cgroup(account: Account) -> Cgroup | None:
    """A cgroup for the next worker, where cgroups can be made (for the run's account, or only
    to hold the worker's processes); None where none can be made now (a worker whose account
    is a cgroup is then measured from /proc, and a measured call is refused: account_for)."""
    if account.cgroup_place is None:
        return None
    try:
        return Cgroup.make(account.cgroup_place)
    except OSError:
        return None


def account_for(account: Account, proc: Worker) -> str:
    """Why a measured call in this fresh worker cannot be trusted ("" when it can): its
    tree not all in its cgroup, or a guarded worker whose filter is not on (read from
    /proc, never from the worker)."""
    if account.cgroup_home is not None:
        proc.counted = proc.cgroup is not None and place_tree(proc)
        if not proc.counted:
            return (
                f"the student's process could not be placed in a cgroup of its own, which "
                f"{account.cgroup_home.label} had allowed at the start of the run: "
                + accounts.CANNOT_APPLY
            )
    if proc.guarded and not seccomp_on(proc.worker):
        return (
            "this machine gives the grader no CPU account that counts every process a call "
            f"may start ({account.why_no_cgroup}), and no way to forbid one (the "
            "worker's seccomp filter is not on: /proc/<pid>/status says so): "
            + accounts.CANNOT_APPLY
        )
    return ""


def meter(proc: Worker) -> Look:
    """From now on: the CPU time the worker's processes have used, and their live pids,
    read from outside: its cgroup's account where it holds them all, else its /proc tree."""
    if proc.counted and proc.cgroup is not None:
        cgroup, start = proc.cgroup, proc.cgroup.cpu_time()
        return lambda: (cgroup.cpu_time().since(start), cgroup.pids())
    before = tree_cpu(proc.root, proc.since)

    def look() -> tuple[CpuTime, set[int]]:
        snapshot, pids = tree_look(proc.root, proc.since)
        return cpu_seconds_between(before, snapshot), pids

    return look



def join_cgroup(procs_fd: int) -> None:
    """Between fork and exec (Popen's preexec_fn): this new process moves itself into the
    cgroup whose cgroup.procs the grader opened, before anything else runs in it; under bwrap,
    before bwrap makes its cgroup namespace, which is then rooted there. A refusal (an older
    kernel checks the writer's own uid, not the opener's) is made good by place_tree."""
    try:
        os.write(procs_fd, b"0")
    except OSError:
        pass


def place_tree(proc: Worker) -> bool:
    """Move every live process of the fresh worker's tree into its cgroup, and look again
    until all are there; False when one cannot be moved. Nothing of the student's has run
    yet, so the tree is the worker's own (bwrap's processes, the worker, a tsx helper)."""
    for _ in range(PLACING_ROUNDS):
        table = tree_table(proc.root, proc.since)
        live = [pid for pid, stat in table.items() if stat.state not in "ZX"]
        outside = [pid for pid in live if not proc.cgroup.holds(pid)]
        if not outside:
            return True
        for pid in outside:
            try:
                proc.cgroup.add(pid)
            except ProcessLookupError:
                continue  # ended meanwhile
            except OSError:
                return False
    return False


def seccomp_on(pid: int) -> bool:
    """Whether the kernel says pid runs under a seccomp filter (/proc/<pid>/status)."""
    try:
        status = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return False
    return any(line.split() == ["Seccomp:", "2"] for line in status.splitlines())


def crash_outcome(proc: Worker, box: sandbox.Sandbox, account: Account) -> Outcome:
    """How the worker ended before it replied, from its exit status."""
    try:
        code = proc.popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return Outcome("crashed", message="the process closed its reply channel and hung")
    if box.signal_from_exit(code):
        code = -box.signal_from_exit(code)  # a wrapper passes a child's signal as 128 + N
    if code == -signal.SIGSYS and proc.guarded:  # its filter killed it: it forked
        why = account.why_no_cgroup
        return Outcome("started_process", message=accounts.STARTED_A_PROCESS.format(why=why))
    if code < 0:
        name = signal.Signals(-code).name
        return Outcome("crashed", message=f"the process was killed by {name}")
    return Outcome(
        "crashed",
        message=f"the process exited with code {code} before returning "
        "(os._exit or a crash in native code?)",
    )

