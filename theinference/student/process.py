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
import time
from collections.abc import Callable
from dataclasses import replace

from theinference.course import directory
from theinference.student import account as accounts
from theinference.student import channel, reach, reaper, startup
from theinference.student.cpu import WORKER_ROOTS
from theinference.student.placement import Placement
from theinference.student.replies import Outcome
from theinference.student.sandbox import RUN_TOKEN_VAR, Sandbox
from theinference.student.setup import Limits, ProcessSetup
from theinference.student.startup import Look, Worker
from theinference.student.watchdog import Watchdog
from theinference.student.worker.protocol import LENGTH

# outcomes after which the worker cannot be trusted to be idle: it is stopped, restarted later
STOPPING = ("timeout", "cpu_limit", "memory_limit", "crashed", "bad_reply", "cancelled")
STOPPING += ("started_process",)  # a guarded worker killed for starting one (worker/guard.py)


class StudentProcess:
    """A lazily (re)started student process. Use as a context manager."""

    def __init__(self, setup: ProcessSetup):
        self.setup = setup
        self.course_dir = setup.course_dir.resolve()
        self.mode = setup.mode
        self.env = dict(setup.env)
        self.weights_path = setup.weights_path
        self.limits = setup.limits
        self.cancel = setup.cancel  # set from another thread: abandon the call
        self._proc: Worker | None = None
        self._early_death: Outcome | None = None
        self.startups = 0
        self.startup_seconds = 0.0
        self.token = secrets.token_hex(8)
        chosen = setup.sandbox or Sandbox("none")
        self._sandbox = chosen
        self.sandbox = chosen.kind  # what this run had: bwrap | unprivileged-user | none
        self.language = setup.language or directory.language_of(self.course_dir)
        self.account = accounts.choose(chosen, self.language)
        self.cpu_account = self.account.kind  # what this run had: account.py
        self.notes = [*chosen.notes, *filter(None, [self.account.note])]
        self.install_reach = reach.writable_install(chosen)  # of the grader's: reach.py
        self.notes += [reach.note(self.install_reach)] if self.install_reach else []
        self._alone = ""  # the next start is a measured call's: guarded or measured (launch.py)
        self._import_output = ("", "")  # what the student's code printed while it loaded
        token = (RUN_TOKEN_VAR, self.token)
        self._place = Placement(
            chosen, self.course_dir, self.weights_path, token, self.language, self.env
        )

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
        return StudentProcess(replace(self.setup, limits=self.limits, mode=mode))

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
        probe: channel.Probe = channel.NO_PROBE,
        cpu_limit: float | Callable[[], float | None] | None = None,
    ) -> Outcome:
        """Ask the student's process for one adapter call and wait for its reply. Its CPU time
        is read by the grader (its cgroup's account, else /proc), never taken from the
        student's own process. Past `cpu_limit` CPU-seconds (the whole tree's, since the call
        started; a callable: read as the call runs) the process is killed and the outcome is
        `cpu_limit` (unless `probe.swapped()`). `probe`: what the call watches for. The worker
        is asked in the course's language, its exception read back as the grader's."""
        spell = self.language.spelled
        hook = spell(probe.hook) if probe.hook else probe.hook
        request = {"adapter": spell(adapter), "args": args, "hook": hook, "watch": probe.watch}
        started, look = self._send(request)
        proc = self._proc
        watchdog = None
        if look is not None and proc is not None:
            watchdog = self._watchdog(proc, look, cpu_limit, probe.swapped)
        outcome = self._receive(started, timeout, watchdog, probe.answer)
        outcome.exception = self.language.grader_exception(outcome.exception)
        if watchdog is not None and self._proc is proc:
            outcome.cpu_seconds = watchdog.charged(watchdog.look()[0])
            # nothing the call started outlives it (where only a stop makes sure, a stop)
            if reaper.end_of_call(proc.root, proc.since, proc.keep, proc.cgroup, self.uid):
                self.stop()
        printed_out, printed_err = self._import_output
        outcome.stdout, outcome.stderr = printed_out + outcome.stdout, printed_err + outcome.stderr
        self._import_output = ("", "")
        return outcome

    def call_alone(self, adapter: str, args: list, timeout: float, cpu_limit: float,
                   warm_up: list | None = None, probe=channel.NO_PROBE) -> Outcome:
        """The call alone in a fresh process whose every CPU-second is accounted (account.py):
        placed in its own cgroup, or forbidden to start a process; stopped after it, so nothing
        of it is at hand later. Stopped past `cpu_limit` CPU-seconds. Where no account can be
        had, or the student's process can write the grader's installation (reach.py), the
        outcome is `unaccounted` and says why; a guarded worker that started a process,
        `started_process`. `warm_up`: arguments the adapter is called with first, in the same
        process and unmeasured (what the adapter loads on its first call is not the request's
        work); an outcome that stops the process is the call's (`probe`: as `call` says)."""
        self.stop()
        if self.account.kind == "none":
            return Outcome("unaccounted", message=accounts.no_account(self.account))
        if self.install_reach:
            return Outcome("unaccounted", message=reach.refusal(self.install_reach))
        self._alone = "guarded" if self.account.kind == "seccomp" else "measured"
        try:
            if refused := self._accounted_start():
                return refused
            if warm_up is not None:
                warmed = self.call(adapter, warm_up, timeout)
                if warmed.kind in STOPPING:
                    return warmed
                if self._proc is None and (refused := self._accounted_start()):  # restarted
                    return refused
            return self.call(adapter, args, timeout, probe, cpu_limit=cpu_limit)
        finally:
            self.stop()
            self._alone = ""

    def _accounted_start(self) -> Outcome | None:
        """Start a measured call's worker; why its calls cannot be trusted, if they cannot."""
        self._start()
        if self._proc is not None and self._proc.unaccounted:
            return Outcome("unaccounted", message=self._proc.unaccounted)
        return None

    def _watchdog(self, proc: Worker, look: Look, cpu_limit, lifted=None) -> Watchdog:
        files = lambda: self._place.file_bytes(proc.worker)  # noqa: E731
        return Watchdog(look, cpu_limit, self.limits.memory_bytes or None, files,
                        lifted=lifted or (lambda: False))

    def _send(self, request: dict) -> tuple[float, Look | None]:
        """When the request went, and the CPU meter started just before it did. The bytes are
        written by the reply loop as the pipe takes them (channel.py): a process that stops
        reading cannot block the grader."""
        if self._proc is None or self._proc.popen.poll() is not None:
            self._start()
        if self._proc is None:  # it could not even start: _receive() says why
            return time.monotonic(), None
        payload = json.dumps(request).encode()
        self._proc.outgoing[:] = LENGTH.pack(len(payload)) + payload
        look = startup.meter(self._proc)  # before the worker starts on it
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
        reaper.empty_uid(self.uid)  # a uid of its own, emptied in one pass (worker and all)
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
        spawned = startup.spawn(self._command, self.account, self._alone == "guarded")
        if isinstance(spawned, Outcome):  # it could not even start
            self._early_death = spawned
            return
        self._proc = spawned
        self.startups += 1
        if self._await_ready(started):  # bwrap's outer process, its PID 1, then the worker
            chain = reaper.worker_chain(spawned.root, self._sandbox.traits.wrapper)
            spawned.keep, spawned.worker = frozenset(chain), chain[-1]
            spawned.unaccounted = startup.account_for(self.account, spawned)
            self._let_load()

    def _command(self, req_read: int, resp_write: int):
        """argv, environment, the user to run as (Popen's arguments) and the course folder
        the process works in, per sandbox (placement.py)."""
        fds = [str(req_read), str(resp_write)]
        mode = self._alone if self._alone and self.mode == "adapters" else self.mode
        return self._place.command(fds, str(self.limits.memory_bytes), mode)

    def _await_ready(self, started: float) -> bool:
        """Wait for the worker's hello (interpreter and NumPy loaded), so start-up is counted
        as the grader's time, not the student's. A worker that cannot start is reported by
        the call that follows."""
        wait = startup.STARTUP_TIMEOUT
        hello = self._collect(started + wait)
        self.startup_seconds += time.monotonic() - started
        if hello.kind == "timeout":
            hello.message = f"the student's process did not start within {wait:g} s"
        if hello.kind != "ready":
            self._early_death = hello
        return hello.kind == "ready"

    def _let_load(self) -> None:
        """Say go, and wait while the student's code is imported (its memory watched), so the
        import is start-up too, not the first call's cost."""
        proc, began = self._proc, time.monotonic()
        proc.outgoing[:] = startup.GO
        wait = max(startup.STARTUP_TIMEOUT, self.limits.timeout)
        memory = self._watchdog(proc, startup.meter(proc), None)
        loaded = self._collect(began + wait, memory)
        self.startup_seconds += time.monotonic() - began
        self._import_output = (loaded.stdout, loaded.stderr)
        if loaded.kind == "timeout":
            loaded.message = f"importing the student's code did not finish within {wait:g} s"
        if loaded.kind != "loaded":
            self._early_death = loaded

    def _collect(self, deadline: float, watchdog: Watchdog | None = None, on_hook=None) -> Outcome:
        """The worker's next reply, or why there is none (channel.py)."""
        ends = channel.Ends(deadline, self.cancel, watchdog, self._crash_outcome)
        return channel.collect(
            self._proc, ends, self.limits.output_bytes, on_hook or channel.no_swap
        )

    def _crash_outcome(self) -> Outcome:
        return startup.crash_outcome(self._proc, self._sandbox, self.account)
