"""Run the student's adapters in a child process and bring back what they returned, as data.

One worker process serves a whole run (start-up is paid once); a crash or a timeout costs only
the call it happened in, and the next call starts a fresh worker. Limits are enforced from
outside: the timeout kills the worker's whole process group with SIGKILL, which no student
code can catch, and its output is read through pipes and capped, never buffered whole.
Where the process runs (inside bubblewrap, as an unprivileged user, or as the grader's user) is
sandbox.py's; what a reply holds, and its decoding, replies.py's. Its CPU time is read from
outside: from its cgroup where the run has one (account.py, cgroups.py), else from /proc.

A worker starts in three steps: it says "ready" (interpreter and NumPy loaded), the grader
places it where its CPU is accounted and checks that it is, then says go, and only then is
the student's code imported ("loaded"): nothing of theirs runs before the account holds.
"""

import json
import os
import secrets
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from theinference.course.languages import PYTHON, LanguageError, course_language
from theinference.student import account as accounts
from theinference.student import channel, reaper, sandbox
from theinference.student.cgroups import Cgroup
from theinference.student.cpu import (
    WORKER_ROOTS,
    cpu_seconds_between,
    read_stat,
    tree_cpu,
    tree_look,
    tree_table,
)
from theinference.student.placement import Placement
from theinference.student.replies import Outcome
from theinference.student.sandbox import RUN_TOKEN_VAR, Sandbox
from theinference.student.watchdog import Watchdog

STARTUP_TIMEOUT = 60.0  # a cold interpreter and NumPy import on a loaded machine
# outcomes after which the worker cannot be trusted to be idle: it is stopped, restarted later
STOPPING = ("timeout", "cpu_limit", "memory_limit", "crashed", "bad_reply", "cancelled")
STOPPING += ("started_process",)  # a guarded worker killed for starting one (worker/guard.py)
PLACING_ROUNDS = 50  # looks at the fresh tree until every process of it is in its cgroup
GO = struct.pack("<Q", 2) + b"{}"  # the grader's go: the student's code may load now
Look = Callable[[], tuple[float, set[int]]]  # CPU seconds since the call began, live pids


@dataclass(frozen=True)
class Limits:
    timeout: float = 60.0  # seconds per adapter call
    memory_bytes: int = 8 << 30  # heap and anonymous memory of the student's process
    output_bytes: int = 64 << 10  # captured stdout and stderr kept per call, each


@dataclass
class _Process:
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


class StudentProcess:
    """A lazily (re)started student process. Use as a context manager."""

    def __init__(
        self,
        course_dir: Path,
        weights_path: Path,
        limits: Limits,
        cancel: threading.Event | None = None,
        sandbox: Sandbox | None = None,
        env: dict[str, str] | None = None,
        mode: str = "adapters",
    ):
        self.course_dir = course_dir.resolve()
        self.mode = mode  # adapters | calibrate (the grader's own code only: calibration.py)
        self.env = dict(env or {})  # set in the process's environment (e.g. BLAS threads)
        self.weights_path = weights_path
        self.limits = limits
        self.cancel = cancel or threading.Event()  # set from another thread: abandon the call
        self._proc: _Process | None = None
        self._early_death: Outcome | None = None
        self.startups = 0
        self.startup_seconds = 0.0
        self.token = secrets.token_hex(8)
        chosen = sandbox or Sandbox("none")
        self._sandbox = chosen
        self.sandbox = chosen.kind  # what this run had: bwrap | unprivileged-user | none
        try:
            self.language = course_language(self.course_dir)
        except LanguageError:
            self.language = PYTHON  # the worker's start reports the course's problem
        self.account = accounts.choose(self.sandbox, self.language)
        self.cpu_account = self.account.kind  # what this run had: account.py
        self.notes = [*chosen.notes, *filter(None, [self.account.note])]
        self._guarded = False  # the next start is a guarded worker's
        self._import_output = ("", "")  # what the student's code printed while it loaded
        token = (RUN_TOKEN_VAR, self.token)
        self._place = Placement(self.sandbox, self.course_dir, weights_path, token, self.env)

    @property
    def uid(self) -> int | None:
        """unprivileged-user: the uid of the student's own (None in other modes)."""
        return self._place.uid

    def __enter__(self) -> "StudentProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def sibling(self, mode: str) -> "StudentProcess":
        """Another process started the same way (course, weights, limits, sandbox) in `mode`."""
        same = (self.course_dir, self.weights_path, self.limits, self.cancel, self._sandbox)
        return StudentProcess(*same, self.env, mode)

    def use_limits(self, limits: Limits) -> None:
        """Limits for the calls that follow (a stage's own); a different memory limit needs a
        fresh process, since a process cannot be trusted to lower its own."""
        if limits.memory_bytes != self.limits.memory_bytes:
            self.stop()
        self.limits = limits

    def call(
        self,
        adapter: str,
        args: list,
        timeout: float | None = None,
        hook: str | None = None,
        on_hook: channel.HookAnswer | None = None,
        cpu_limit: float | None = None,
    ) -> Outcome:
        """Ask the student's process for one adapter call and wait for its reply. Its CPU time
        is read by the grader (its cgroup's account, else /proc), never taken from the
        student's own process. Past
        `cpu_limit` CPU-seconds (the whole tree's, since the call started) the process is
        killed and the outcome is `cpu_limit`. With `hook`, every function of that name in the
        course tells the grader when it returns and waits: `on_hook(word)` answers (by
        default, carry on: channel.no_swap)."""
        request = {"adapter": adapter, "args": args, "hook": hook}
        started, look = self._send(request)
        proc = self._proc
        watchdog = None
        if look is not None and proc is not None:
            watchdog = self._watchdog(proc, look, cpu_limit)
        outcome = self._receive(started, timeout, watchdog, on_hook)
        if look is not None and proc is not None and self._proc is proc:
            outcome.cpu_seconds = look()[0]
            # nothing the call started outlives it: the next call starts from the worker alone
            reaper.kill_tree(proc.root, proc.since, proc.keep)
        printed_out, printed_err = self._import_output
        outcome.stdout, outcome.stderr = printed_out + outcome.stdout, printed_err + outcome.stderr
        self._import_output = ("", "")
        return outcome

    def call_alone(self, adapter: str, args: list, timeout: float, cpu_limit: float) -> Outcome:
        """The call alone in a fresh process whose every CPU-second is accounted (account.py):
        placed in its own cgroup, or forbidden to start a process; stopped after it, so nothing
        of it is at hand later. Stopped past `cpu_limit` CPU-seconds. Where no account can be
        had, the outcome is `unaccounted` and says why; a guarded worker that started a
        process, `started_process`."""
        self.stop()
        if self.account.kind == "none":
            return Outcome("unaccounted", message=accounts.no_account(self.account))
        self._guarded = self.account.kind == "seccomp"
        try:
            self._start()
            proc = self._proc
            if proc is not None and proc.unaccounted:
                return Outcome("unaccounted", message=proc.unaccounted)
            return self.call(adapter, args, timeout, cpu_limit=cpu_limit)
        finally:
            self.stop()
            self._guarded = False

    def _watchdog(self, proc: _Process, look: Look, cpu_limit: float | None) -> Watchdog:
        files = lambda: self._place.file_bytes(proc.worker)  # noqa: E731
        return Watchdog(look, cpu_limit, self.limits.memory_bytes or None, files)

    def _meter(self, proc: _Process) -> Look:
        """From now on: the CPU seconds the worker's processes have used, and their live pids,
        read from outside: its cgroup's account where it holds them all, else its /proc tree."""
        if proc.counted and proc.cgroup is not None:
            cgroup, start = proc.cgroup, proc.cgroup.cpu_seconds()
            return lambda: (cgroup.cpu_seconds() - start, cgroup.pids())
        before = tree_cpu(proc.root, proc.since)

        def look() -> tuple[float, set[int]]:
            snapshot, pids = tree_look(proc.root, proc.since)
            return cpu_seconds_between(before, snapshot), pids

        return look

    def _send(self, request: dict) -> tuple[float, Look | None]:
        """When the request went, and the CPU meter started just before it did. The bytes are
        written by the reply loop as the pipe takes them (channel.py): a process that stops
        reading cannot block the grader."""
        if self._proc is None or self._proc.popen.poll() is not None:
            self._start()
        if self._proc is None:  # it could not even start: _receive() says why
            return time.monotonic(), None
        payload = json.dumps(request).encode()
        self._proc.outgoing[:] = struct.pack("<Q", len(payload)) + payload
        look = self._meter(self._proc)  # before the worker starts on it
        return time.monotonic(), look

    def _receive(
        self,
        started: float,
        timeout: float | None,
        watchdog: Watchdog | None = None,
        on_hook: channel.HookAnswer | None = None,
    ) -> Outcome:
        if self._early_death is not None:  # the worker never said hello
            outcome, self._early_death = self._early_death, None
            self.stop()
            return outcome
        timeout = timeout if timeout is not None else self.limits.timeout
        outcome = self._collect(started + timeout, watchdog, on_hook)
        if outcome.kind == "timeout":
            outcome.message = f"timed out after {timeout:g} s (the process was killed)"
        outcome.seconds = time.monotonic() - started
        if outcome.kind in STOPPING:
            self.stop()
        return outcome

    def stop(self) -> None:
        """Kill the worker and everything it started: its process group, its whole tree
        (however it detached: see reaper.py), every process of its own uid, and any process
        still carrying this run's token."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        reaper.kill_tree(proc.root, proc.since, uid=self.uid)
        for fd in (proc.requests, proc.replies):
            try:
                os.close(fd)
            except OSError:
                pass
        for stream in (proc.popen.stdout, proc.popen.stderr):
            stream.close()
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.popen.wait()
        WORKER_ROOTS.discard(proc.root)
        reaper.kill_tree(proc.root, proc.since, uid=self.uid)  # and reap what the root left
        reaper.kill_tagged(RUN_TOKEN_VAR, self.token)
        if proc.cgroup is not None:  # whatever is still in it, then the cgroup itself
            proc.cgroup.kill_all()
            reaper.reap_orphans(proc.root, proc.since, frozenset())
            proc.cgroup.remove()

    def close(self) -> None:
        """Stop the process and remove what its runs needed (unprivileged-user's directory,
        and what its uid left in the host's shared memory-backed folders)."""
        self.stop()
        self._place.close()

    # --- internals ---------------------------------------------------------------------------

    def _start(self) -> None:
        self.stop()
        reaper.become_subreaper()
        started = time.monotonic()
        cgroup = self._new_cgroup()
        req_read, req_write = os.pipe()
        resp_read, resp_write = os.pipe()
        joining = os.open(cgroup.procs, os.O_WRONLY) if cgroup is not None else None
        try:
            argv, env, as_user, cwd = self._command(req_read, resp_write)
            popen = subprocess.Popen(
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
            self._early_death = Outcome("crashed", message=message)
            return
        finally:
            if joining is not None:
                os.close(joining)
        os.close(req_read)
        os.close(resp_write)
        os.set_blocking(req_write, False)  # written as it drains: see channel.py
        WORKER_ROOTS.add(popen.pid)
        stat = read_stat(popen.pid)
        since = stat.start if stat is not None else 0
        self._proc = _Process(popen=popen, requests=req_write, replies=resp_read, since=since)
        self._proc.cgroup, self._proc.guarded = cgroup, self._guarded
        self.startups += 1
        if self._await_ready(started):  # bwrap's outer process, its PID 1, then the worker
            chain = reaper.worker_chain(popen.pid, "bwrap" if self.sandbox == "bwrap" else None)
            self._proc.keep, self._proc.worker = frozenset(chain), chain[-1]
            self._proc.unaccounted = self._account_for(self._proc)
            self._let_load()

    def _new_cgroup(self) -> Cgroup | None:
        """A cgroup for the next worker, where the run's account is one; None where it is not,
        or where none can be made now (the worker's calls are then measured from /proc, and a
        measured call is refused: _account_for)."""
        if self.account.cgroup_home is None:
            return None
        try:
            return Cgroup.make(self.account.cgroup_home)
        except OSError:
            return None

    def _account_for(self, proc: _Process) -> str:
        """Why a measured call in this fresh worker cannot be trusted ("" when it can): its
        tree not all in its cgroup, or a guarded worker whose filter is not on (read from
        /proc, never from the worker)."""
        if self.account.cgroup_home is not None:
            proc.counted = proc.cgroup is not None and place_tree(proc)
            if not proc.counted:
                return (
                    f"the student's process could not be placed in a cgroup of its own, which "
                    f"{self.account.cgroup_home.label} had allowed at the start of the run: "
                    + accounts.CANNOT_APPLY
                )
        if proc.guarded and not seccomp_on(proc.worker):
            return (
                "this machine gives the grader no CPU account that counts every process a call "
                f"may start ({self.account.why_no_cgroup}), and no way to forbid one (the "
                "worker's seccomp filter is not on: /proc/<pid>/status says so): "
                + accounts.CANNOT_APPLY
            )
        return ""

    def _command(self, req_read: int, resp_write: int):
        """argv, environment, the user to run as (Popen's arguments) and the course folder
        the process works in, per sandbox (placement.py)."""
        fds = [str(req_read), str(resp_write)]
        mode = "guarded" if self._guarded and self.mode == "adapters" else self.mode
        return self._place.command(fds, str(self.limits.memory_bytes), mode)

    def _await_ready(self, started: float) -> bool:
        """Wait for the worker's hello (interpreter and NumPy loaded), so start-up is counted
        as the grader's time, not the student's. A worker that cannot start is reported by
        the call that follows."""
        hello = self._collect(started + STARTUP_TIMEOUT)
        self.startup_seconds += time.monotonic() - started
        if hello.kind == "timeout":
            hello.message = f"the student's process did not start within {STARTUP_TIMEOUT:g} s"
        if hello.kind != "ready":
            self._early_death = hello
        return hello.kind == "ready"

    def _let_load(self) -> None:
        """Say go, and wait while the student's code is imported (its memory watched), so the
        import is start-up too, not the first call's cost."""
        proc, began = self._proc, time.monotonic()
        proc.outgoing[:] = GO
        wait = max(STARTUP_TIMEOUT, self.limits.timeout)
        memory = self._watchdog(proc, self._meter(proc), None)
        loaded = self._collect(began + wait, memory)
        self.startup_seconds += time.monotonic() - began
        self._import_output = (loaded.stdout, loaded.stderr)
        if loaded.kind == "timeout":
            loaded.message = f"importing the student's code did not finish within {wait:g} s"
        if loaded.kind != "loaded":
            self._early_death = loaded

    def _collect(self, deadline: float, watchdog: Watchdog | None = None, on_hook=None) -> Outcome:
        """The worker's next reply, or why there is none (channel.py)."""
        return channel.collect(
            self._proc,
            deadline,
            self.cancel,
            watchdog,
            self.limits.output_bytes,
            self._crash_outcome,
            on_hook or channel.no_swap,
        )

    def _crash_outcome(self) -> Outcome:
        try:
            code = self._proc.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return Outcome("crashed", message="the process closed its reply channel and hung")
        if self.sandbox == "bwrap" and sandbox.signal_from_exit(code):
            code = -sandbox.signal_from_exit(code)  # bwrap passes a child's signal as 128 + N
        if code == -signal.SIGSYS and self._proc.guarded:  # its filter killed it: it forked
            why = self.account.why_no_cgroup
            return Outcome("started_process", message=accounts.STARTED_A_PROCESS.format(why=why))
        if code < 0:
            name = signal.Signals(-code).name
            return Outcome("crashed", message=f"the process was killed by {name}")
        return Outcome(
            "crashed",
            message=f"the process exited with code {code} before returning "
            "(os._exit or a crash in native code?)",
        )


def join_cgroup(procs_fd: int) -> None:
    """Between fork and exec (Popen's preexec_fn): this new process moves itself into the
    cgroup whose cgroup.procs the grader opened, before anything else runs in it; under bwrap,
    before bwrap makes its cgroup namespace, which is then rooted there. A refusal (an older
    kernel checks the writer's own uid, not the opener's) is made good by place_tree."""
    try:
        os.write(procs_fd, b"0")
    except OSError:
        pass


def place_tree(proc: _Process) -> bool:
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
