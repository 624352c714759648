"""Run the student's adapters in a child process and bring back what they returned, as data.

One worker process serves a whole run (start-up is paid once); a crash or a timeout costs only
the call it happened in, and the next call starts a fresh worker. Limits are enforced from
outside: the timeout kills the worker's whole process group with SIGKILL, which no student
code can catch, and its output is read through pipes and capped, never buffered whole.
Where the process runs (inside bubblewrap, as an unprivileged user, or as the grader's user) is
sandbox.py's; what a reply holds, and its decoding, replies.py's.
"""

import json
import os
import secrets
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from theinference.student import channel, reaper, sandbox
from theinference.student.cpu import (
    WORKER_ROOTS,
    Snapshot,
    cpu_seconds_between,
    read_stat,
    tree_cpu,
    tree_look,
)
from theinference.student.placement import Placement
from theinference.student.replies import Outcome
from theinference.student.sandbox import RUN_TOKEN_VAR, Sandbox
from theinference.student.watchdog import Watchdog

STARTUP_TIMEOUT = 60.0  # a cold interpreter and NumPy import on a loaded machine
# outcomes after which the worker cannot be trusted to be idle: it is stopped, restarted later
STOPPING = ("timeout", "cpu_limit", "memory_limit", "crashed", "bad_reply", "cancelled")


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
        self.notes = list(chosen.notes)
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
        watch: str | None = None,
    ) -> Outcome:
        """Ask the student's process for one adapter call and wait for its reply. Its CPU time
        is read from /proc by the grader, never taken from the student's own process. Past
        `cpu_limit` CPU-seconds (the whole tree's, since the call started) the process is
        killed and the outcome is `cpu_limit`. With `hook`, every function of that name in the
        course tells the grader when it returns and waits: `on_hook(word)` answers (by
        default, carry on: channel.no_swap); with `watch` "returns", any return after the
        prompt's prefill does, whatever it is called (worker/probes.py)."""
        request = {"adapter": adapter, "args": args, "hook": hook, "watch": watch}
        started, before = self._send(request)
        proc = self._proc
        watchdog = None
        if before is not None and proc is not None:
            watchdog = Watchdog(
                lambda: tree_look(proc.root, proc.since),
                before,
                cpu_limit,
                self.limits.memory_bytes or None,
                lambda: self._place.file_bytes(proc.worker),
            )
        outcome = self._receive(started, timeout, watchdog, on_hook)
        if before is not None and proc is not None and self._proc is proc:
            outcome.cpu_seconds = cpu_seconds_between(before, tree_cpu(proc.root, proc.since))
            # nothing the call started outlives it: the next call starts from the worker alone
            reaper.kill_tree(proc.root, proc.since, proc.keep)
        return outcome

    def _send(self, request: dict) -> tuple[float, Snapshot | None]:
        """When the request went, and the process tree's CPU ticks just before it did. The
        bytes are written by the reply loop as the pipe takes them (channel.py): a process
        that stops reading cannot block the grader."""
        if self._proc is None or self._proc.popen.poll() is not None:
            self._start()
        if self._proc is None:  # it could not even start: _receive() says why
            return time.monotonic(), None
        payload = json.dumps(request).encode()
        self._proc.outgoing[:] = struct.pack("<Q", len(payload)) + payload
        before = tree_cpu(self._proc.root, self._proc.since)  # before the worker starts on it
        return time.monotonic(), before

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
        req_read, req_write = os.pipe()
        resp_read, resp_write = os.pipe()
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
                **as_user,
            )
        except OSError as exc:
            for fd in (req_read, req_write, resp_read, resp_write):
                os.close(fd)
            message = f"the student's process could not start: {exc.strerror or exc}"
            self._early_death = Outcome("crashed", message=message)
            return
        os.close(req_read)
        os.close(resp_write)
        os.set_blocking(req_write, False)  # written as it drains: see channel.py
        WORKER_ROOTS.add(popen.pid)
        stat = read_stat(popen.pid)
        since = stat.start if stat is not None else 0
        self._proc = _Process(popen=popen, requests=req_write, replies=resp_read, since=since)
        self.startups += 1
        self._await_ready(started)
        if self._proc is not None:  # bwrap's outer process, its PID 1, then the worker
            chain = reaper.worker_chain(popen.pid, "bwrap" if self.sandbox == "bwrap" else None)
            self._proc.keep, self._proc.worker = frozenset(chain), chain[-1]

    def _command(self, req_read: int, resp_write: int):
        """argv, environment, the user to run as (Popen's arguments) and the course folder
        the process works in, per sandbox (placement.py)."""
        fds = [str(req_read), str(resp_write)]
        return self._place.command(fds, str(self.limits.memory_bytes), self.mode)

    def _await_ready(self, started: float) -> None:
        """Wait for the worker's hello (interpreter and NumPy loaded), so start-up is counted
        as the grader's time, not the student's. A worker that cannot start is reported by
        the call that follows."""
        hello = self._collect(started + STARTUP_TIMEOUT)
        self.startup_seconds += time.monotonic() - started
        if hello.kind == "timeout":
            hello.message = f"the student's process did not start within {STARTUP_TIMEOUT:g} s"
        if hello.kind != "ready":
            self._early_death = hello

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
        if code < 0:
            name = signal.Signals(-code).name
            return Outcome("crashed", message=f"the process was killed by {name}")
        return Outcome(
            "crashed",
            message=f"the process exited with code {code} before returning "
            "(os._exit or a crash in native code?)",
        )
