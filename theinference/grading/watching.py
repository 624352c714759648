"""`theinference test --watch`: grade, then regrade on every real change, for as long as the
student keeps the terminal open.

Three sources feed one queue: file events (watchfiles, in a thread), commands (keys, read by
whoever owns the terminal) and "run finished" from the grading thread. A change while a run is
going stops that run (its worker is killed) and starts a fresh one, so a verdict on stale code
is never awaited. Every run goes through session.run, the same function as a single run; what
the student sees is the view's (the output layer draws it), and nothing here prints.
"""

import hashlib
import os
import queue
import secrets
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from theinference import exits
from theinference.course import languages
from theinference.curriculum.stages import Stage
from theinference.grading.ahead import Between, plan_ahead
from theinference.grading.environment import blas_is_one_thread
from theinference.grading.session import Session, exit_code, run
from theinference.results import RunResult, StageResult, Status
from theinference.results.events import Listener

WATCHED_SUFFIXES = (".toml", *(s for lang in languages.ALL for s in lang.source_suffixes))
IGNORED_DIRS = {"__pycache__", "node_modules", "venv", "env", "build", "dist"}
POLL_SECONDS = 0.3
QUIT_WAIT = 5.0  # seconds a quit waits for the run it stops
TEMP_SUFFIXES = ("~", ".swp", ".swo", ".swx", ".tmp", ".bak", ".orig")

# what the student can ask of the loop (the view's key reader maps keys to these)
RERUN, EVERY_STAGE, NEXT_STAGE, HINT, QUIT = "rerun", "every stage", "next stage", "hint", "quit"


class WatchView(Protocol):
    """What the student sees of the loop. `drawing`, `failed` and `ended` are called from the
    grading thread; `stopped`, `nothing_after` and `hint` from the loop's."""

    def drawing(self, trigger: str, cancel: threading.Event) -> Listener:
        """The listener that draws one run as it goes."""

    def ended(self, result: RunResult | None) -> None:
        """A run is over: stopped (result.cancelled), finished, or failed in the grader (None)."""

    def stopped(self, reason: str) -> None:
        """A run was stopped before its end, for this reason."""

    def failed(self, message: str) -> None:
        """The grader itself failed during a run (the loop carries on)."""

    def nothing_after(self, slug: str) -> None:
        """`next stage` was asked on the course's last stage."""

    def hint(self, stage: Stage, graded: StageResult | None) -> None:
        """The guidance of the stage in focus, under its last diagnosis."""


class Commands(Protocol):
    """Where the student's commands come from (the terminal's keys, or lines on stdin)."""

    def start(self, command: Callable[[str], None]) -> None: ...

    def restore(self) -> None: ...


def is_watched(rel: Path) -> bool:
    """Source and settings files only: not editor swap or backup files, caches or bytecode,
    nor anything in a hidden directory (.git, .venv, the grader's own .theinference/)."""
    if any(part.startswith(".") or part in IGNORED_DIRS for part in rel.parts[:-1]):
        return False
    name = rel.name
    if name.startswith((".", "#", "~")) or name.endswith(TEMP_SUFFIXES):
        return False
    return name.endswith(WATCHED_SUFFIXES)


def snapshot(root: Path) -> dict[str, str]:
    """Content hashes of the watched files: a save that changes nothing triggers nothing."""
    hashes = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in IGNORED_DIRS]
        for name in files:
            path = Path(folder, name)
            rel = path.relative_to(root)
            if is_watched(rel):
                try:
                    hashes[str(rel)] = hashlib.sha1(path.read_bytes()).hexdigest()
                except OSError:
                    continue  # deleted or unreadable between listing and reading
    return hashes


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


class WatchLoop:
    def __init__(self, session: Session, view: WatchView, commands: Commands, poll: bool):
        self.session = session
        self.quiet = replace(session, renderer=None)  # the view draws every run
        self.view = view
        self.commands = commands
        self.poll = poll
        self.root = session.course.root
        self.focus = list(session.stages)  # the stages a rerun grades; `next stage` moves it
        self.last_result: RunResult | None = None
        self.events: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.current: tuple[threading.Thread, threading.Event, threading.Event] | None = None
        self.last_code = exits.NOT_PASSED
        self.watching = threading.Event()  # set once file events are being observed
        self.next_seed: int | None = None  # the seed whose swap plans are made ahead

    def run(self) -> int:
        threading.Thread(target=self._watch_files, daemon=True).start()
        # a save made before the watcher's first scan would be missed: wait for it
        self.watching.wait(timeout=5)
        self.commands.start(lambda command: self.events.put(("command", command)))
        state = snapshot(self.root)
        self._start(self.focus, "")
        try:
            while True:
                try:
                    kind, payload = self.events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if kind == "files":
                    now = snapshot(self.root)
                    changed, state = changed_files(state, now), now
                    if changed:
                        self._start(self.focus, f"{', '.join(changed)} changed")
                elif kind == "done":
                    self.last_code = payload
                elif payload == QUIT:
                    return self.last_code
                else:
                    self._obey(payload)
        except KeyboardInterrupt:
            return exits.INTERRUPTED
        finally:
            self.stop.set()
            self.commands.restore()  # the terminal is the shell's again at once
            # quitting never waits long on a run: one still going dies with this process, and
            # the student's process with it (it is killed when its parent ends)
            self._stop_current("", wait=QUIT_WAIT)

    def _obey(self, command: str) -> None:
        if command == NEXT_STAGE:
            self._next_stage()
        elif command == HINT:
            self._show_hint()
        elif command == EVERY_STAGE:
            self._start(self.session.all_stages, "all stages")
        elif command == RERUN:
            self._start(self.focus, "rerun")

    def _watch_files(self) -> None:
        if self.poll:
            return self._poll_files()
        from watchfiles import watch

        def relevant(_change, path: str) -> bool:
            try:
                return is_watched(Path(path).relative_to(self.root))
            except ValueError:
                return False

        for changes in watch(
            self.root,
            watch_filter=relevant,
            stop_event=self.stop,
            debounce=200,
            step=50,
            raise_interrupt=False,
            ignore_permission_denied=True,
            yield_on_timeout=True,
            rust_timeout=100,
        ):
            self.watching.set()  # the first (empty) yield: the watcher is live
            if changes:
                self.events.put(("files", changes))

    def _poll_files(self) -> None:
        """--poll: where file events never arrive (WSL, NFS, network drives), compare content
        hashes a few times a second instead."""
        last = snapshot(self.root)
        self.watching.set()
        while not self.stop.wait(POLL_SECONDS):
            now = snapshot(self.root)
            if now != last:
                last = now
                self.events.put(("files", set()))

    def _start(self, stages: list[Stage], trigger: str) -> None:
        self._stop_current(trigger)  # and the plans made ahead, which it waits for
        seed, self.next_seed = self.next_seed, None  # each seed grades one run at most
        cancel, ran = threading.Event(), threading.Event()
        thread = threading.Thread(target=self._grade, args=(stages, cancel, ran, trigger, seed),
                                  daemon=True)
        self.current = (thread, cancel, ran)
        thread.start()

    def _grade(self, stages: list[Stage], cancel: threading.Event, ran: threading.Event,
               trigger: str, seed: int | None) -> None:
        result = None
        session = self.quiet if seed is None else replace(
            self.quiet, seed=seed, fresh_seed=self.session.seed is None)
        try:
            result = run(session, stages, cancel, trigger, self.view.drawing(trigger, cancel))
        except Exception as exc:  # the watcher outlives anything, its own surprises included
            self.view.failed(f"the run failed inside the grader: {failure(exc)}")
        # the verdict is recorded before it is drawn: a key pressed once the student sees it
        # (q, h) is queued after it
        if result is None:
            self.events.put(("done", exits.NOT_PASSED))
        elif not result.cancelled:
            self.last_result = result
            self.events.put(("done", exit_code(result)))
        try:
            self.view.ended(result)
        except Exception as exc:
            self.view.failed(f"drawing the run failed inside the grader: {failure(exc)}")
        answers = self.session.answers
        if result is None or result.cancelled or answers is None:
            ran.set()
            return
        # the next run's seed, and the note that its plans are being made, before the next
        # run can start (`ran`): its Planner waits for them where it waits for any planner
        seed = self.session.seed if self.session.seed is not None else secrets.randbits(63)
        self.next_seed = seed
        previous, answers.last_planner = answers.last_planner, Between(threading.current_thread())
        ran.set()
        self._plan_next(answers, previous, seed, cancel)

    def _plan_next(self, answers, previous, seed: int, stop: threading.Event) -> None:
        """While the student edits: the next run's swap plans (ahead.py) with its seed (--seed's,
        else a fresh one), until the next run starts (it sets `stop`, and waits for the plan
        being made only where a measured call must run alone)."""
        try:
            if previous is not None:  # the last stage's planner, maybe finishing a plan
                previous.done()
            plan_ahead(self.focus, answers, self.session.policy, seed, stop,
                       seed_given=self.session.seed is not None)
        except Exception:  # the run makes what is missing itself, and says what fails
            answers.ahead.clear()

    def _next_stage(self) -> None:
        """Watch the stage after the last one watched, in course order."""
        order = [s.slug for s in self.session.all_stages]
        last = self.focus[-1].slug if self.focus else order[0]
        position = order.index(last) if last in order else -1
        if position + 1 >= len(order):
            self.view.nothing_after(last)
            return
        following = self.session.all_stages[position + 1]
        self.focus = [following]
        self._start(self.focus, f"next stage: {following.slug}")

    def _show_hint(self) -> None:
        """The first stage in focus not passed in the last run (else the last in focus)."""
        graded = {s.slug: s for s in self.last_result.stages} if self.last_result else {}
        not_passed = [s for s in self.focus
                      if graded.get(s.slug) is None or graded[s.slug].status != Status.PASSED]
        focus = not_passed[0] if not_passed else self.focus[-1]
        self.view.hint(focus, graded.get(focus.slug))

    def _stop_current(self, reason: str, wait: float | None = None) -> None:
        if self.current is None:
            return
        thread, cancel, ran = self.current
        self.current = None
        cancel.set()
        if not ran.is_set():  # the run is going (else it plans the next: not waited for)
            ran.wait(wait)
            if reason:
                self.view.stopped(reason)
        elif not blas_is_one_thread():  # a student process forked beside OpenBLAS's threads
            thread.join(wait)  # would hang (environment.blas_is_one_thread): the plan ends first
