"""`theinference test --watch`: grade, then regrade on every real change, for as long as the
student keeps the terminal open.

Three sources feed one queue: file events (watchfiles, in a thread), keys (a thread reading
the terminal, or lines when stdin is not a terminal) and "run finished" from the grading
thread. A change while a run is going stops that run (its worker is killed) and starts a fresh
one, so a verdict on stale code is never awaited. Every run goes through session.run, the
same function as a single run.
"""

import hashlib
import os
import queue
import select
import sys
import threading
from dataclasses import replace
from pathlib import Path

from theinference import exits
from theinference.course import languages
from theinference.curriculum.stages import Stage
from theinference.grading.session import Session, exit_code, run

WATCHED_SUFFIXES = (".toml", *(s for lang in languages.ALL for s in lang.source_suffixes))
IGNORED_DIRS = {"__pycache__", "node_modules", "venv", "env", "build", "dist"}
POLL_SECONDS = 0.3
QUIT_WAIT = 5.0  # seconds a quit waits for the run it stops
TEMP_SUFFIXES = ("~", ".swp", ".swo", ".swx", ".tmp", ".bak", ".orig")


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


class Watch:
    def __init__(self, session: Session, poll: bool, clear: bool = True):
        from theinference.output.report import console

        self.session = session
        self.poll = poll
        self.root = session.course.root
        self.out = console()
        # the redrawn screen needs a terminal; --no-clear or a pipe keep the log form
        self.screen = clear and self.out.is_terminal
        self.last_result = None
        self.events: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.current: tuple[threading.Thread, threading.Event] | None = None
        self.last_code = exits.NOT_PASSED
        self.keys = KeyReader(self.events, self.stop)
        self.watching = threading.Event()  # set once file events are being observed

    def loop(self) -> int:
        threading.Thread(target=self._watch_files, daemon=True).start()
        # a save made before the watcher's first scan would be missed: wait for it
        self.watching.wait(timeout=5)
        self.keys.start()
        state = snapshot(self.root)
        self._start(self.session.stages, "")
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
                        self._start(self.session.stages, f"{', '.join(changed)} changed")
                elif kind == "key" and payload == "q":
                    return self.last_code
                elif kind == "key" and payload in ("n", "h"):
                    self._next_stage() if payload == "n" else self._show_hint()
                elif kind == "key":
                    every = payload == "a"
                    stages = self.session.all_stages if every else self.session.stages
                    self._start(stages, "all stages" if every else "rerun")
                elif kind == "done":
                    self.last_code, drawn = payload
                    if not drawn:
                        self._print_watching()
        except KeyboardInterrupt:
            return exits.INTERRUPTED
        finally:
            self.stop.set()
            # quitting never waits long on a run: one still going dies with this process, and
            # the student's process with it (it is killed when its parent ends)
            self._stop_current("", wait=QUIT_WAIT)
            self.keys.restore()

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
            force_polling=self.poll,
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
        self._stop_current(trigger)
        cancel = threading.Event()
        thread = threading.Thread(target=self._grade, args=(stages, cancel, trigger), daemon=True)
        self.current = (thread, cancel)
        thread.start()

    def _grade(self, stages: list[Stage], cancel: threading.Event, trigger: str) -> None:
        from theinference.output.screen import WatchScreen

        screen = WatchScreen(self.out, self.session, self.keys.single_keys) if self.screen else None
        try:
            if screen is None:
                result = run(self.session, stages, cancel, trigger)
            else:
                listener = screen.listener(trigger, cancel)
                result = run(self._quiet_session(), stages, cancel, trigger, listener)
                screen.close()
                if not result.cancelled:
                    screen.draw(result)
        except Exception as exc:  # the watcher outlives anything, its own surprises included
            from theinference.output.report import print_error

            print_error(f"the run failed inside the grader: {type(exc).__name__}: {exc}")
            self.events.put(("done", (exits.NOT_PASSED, False)))
            return
        finally:
            if screen is not None:
                screen.close()
        if not result.cancelled:
            self.last_result = result
            self.events.put(("done", (exit_code(result), screen is not None)))

    def _quiet_session(self) -> Session:
        """The session without its terminal report: the screen draws instead (result files
        are still written)."""
        return replace(self.session, renderer=None)

    def _next_stage(self) -> None:
        """Key n: watch the stage after the last one watched, in course order."""
        from theinference.output.report import print_cancelled

        order = [s.slug for s in self.session.all_stages]
        last = self.session.stages[-1].slug if self.session.stages else order[0]
        position = order.index(last) if last in order else -1
        if position + 1 >= len(order):
            print_cancelled(self.out, f"{last} is the last stage")
            return
        following = self.session.all_stages[position + 1]
        self.session.stages = [following]
        self._start(self.session.stages, f"next stage: {following.slug}")

    def _show_hint(self) -> None:
        """Key h: the guidance of the stage in focus, and its last diagnosis, below the screen."""
        from theinference.output.screen import hint_block

        graded = {s.slug: s for s in self.last_result.stages} if self.last_result else {}
        focus = next(
            (
                s
                for s in self.session.stages
                if graded.get(s.slug) is None or graded[s.slug].status.value != "passed"
            ),
            self.session.stages[-1],
        )
        self.out.print(hint_block(focus.slug, focus.title, focus.guidance, graded.get(focus.slug)))

    def _stop_current(self, reason: str, wait: float | None = None) -> None:
        if self.current is None:
            return
        thread, cancel = self.current
        self.current = None
        if thread.is_alive():
            cancel.set()
            thread.join(wait)
            if reason:
                from theinference.output.report import print_cancelled

                print_cancelled(self.out, reason)

    def _print_watching(self) -> None:
        from theinference.output.report import print_watching

        print_watching(self.out, self.keys.single_keys)


class KeyReader:
    """Keys from the terminal (single keys, no Enter needed) or, when stdin is not a terminal,
    lines: r or an empty line reruns, a runs all stages, q quits."""

    def __init__(self, events: queue.Queue, stop: threading.Event):
        self.events = events
        self.stop = stop
        self.fd = sys.stdin.fileno() if sys.stdin and not sys.stdin.closed else None
        self.single_keys = self.fd is not None and os.isatty(self.fd)
        self._saved = None

    def start(self) -> None:
        if self.fd is None:
            return
        if self.single_keys:
            import termios
            import tty

            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)  # keys arrive one by one; Ctrl-C still interrupts
        threading.Thread(target=self._read, daemon=True).start()

    def restore(self) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def _read(self) -> None:
        buffer = b""
        while not self.stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            chunk = os.read(self.fd, 1024)
            if not chunk:
                return  # stdin closed: file events still work
            if self.single_keys:
                for key in chunk.decode(errors="ignore"):
                    self._key(key)
                continue
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self._key(line.decode(errors="ignore").strip()[:1] or "\n")

    def _key(self, key: str) -> None:
        key = key.lower()
        if key in ("r", "\n", "\r"):
            self.events.put(("key", "r"))
        elif key in ("a", "q", "n", "h"):
            self.events.put(("key", key))


def watch_loop(session: Session, poll: bool = False, clear: bool = True) -> int:
    return Watch(session, poll, clear).loop()
