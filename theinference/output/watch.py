"""What the student sees and types while `theinference test --watch` runs (the loop itself is
grading/watching.py): the redrawn screen or the log form, and the keys.

In a terminal each run clears the screen and is redrawn whole when it ends (screen.py); with
--no-clear, or when stdout is not a terminal, runs follow one another in the scrollback as
`theinference test` prints them.
"""

import os
import select
import sys
import threading
from collections.abc import Callable

from rich.console import Console

from theinference.curriculum.stages import Stage
from theinference.grading.session import Session
from theinference.grading.watching import EVERY_STAGE, HINT, NEXT_STAGE, QUIT, RERUN
from theinference.results import RunResult, StageResult
from theinference.results.events import Listener, ignore

KEYS = {"r": RERUN, "\n": RERUN, "\r": RERUN, "a": EVERY_STAGE, "n": NEXT_STAGE, "h": HINT,
        "q": QUIT}


class WatchOutput:
    """What both forms print the same way."""

    def __init__(self, out: Console, single_keys: bool):
        self.out = out
        self.single_keys = single_keys

    def stopped(self, reason: str) -> None:
        from theinference.output.report import print_cancelled

        print_cancelled(self.out, reason)

    def failed(self, message: str) -> None:
        from theinference.output.report import print_error

        print_error(message)

    def nothing_after(self, slug: str) -> None:
        from rich.text import Text

        self.out.print(Text(f"{slug} is the last stage", style="dim"))

    def hint(self, stage: Stage, graded: StageResult | None) -> None:
        from theinference.output.screen import hint_block

        self.out.print(hint_block(stage.slug, stage.title, stage.guidance, graded))

    def waiting(self) -> None:
        from theinference.output.report import print_watching

        print_watching(self.out, self.single_keys)


class ScreenView(WatchOutput):
    """Each run on a cleared screen, redrawn whole when it ends (the redraw ends with the keys)."""

    def __init__(self, out: Console, session: Session, single_keys: bool):
        super().__init__(out, single_keys)
        self.session = session
        self.screen = None

    def drawing(self, trigger: str, cancel: threading.Event) -> Listener:
        from theinference.output.screen import WatchScreen

        self.screen = WatchScreen(self.out, self.session, self.single_keys)
        return self.screen.listener(trigger, cancel)

    def ended(self, result: RunResult | None) -> None:
        if self.screen is not None:
            self.screen.close()  # a live status line must not outlive its run
        if result is None:
            self.waiting()
        elif not result.cancelled:
            self.screen.draw(result)


class LogView(WatchOutput):
    """Each run in the scrollback as `theinference test` prints it (the session's renderer;
    none when the session writes a machine format to stdout), then the keys."""

    def __init__(self, out: Console, session: Session, single_keys: bool):
        super().__init__(out, single_keys)
        self.renderer = session.renderer
        self.current = None

    def drawing(self, trigger: str, cancel: threading.Event) -> Listener:
        self.current = self.renderer(trigger, cancel) if self.renderer else ignore
        return self.current

    def ended(self, result: RunResult | None) -> None:
        getattr(self.current, "close", lambda: None)()
        if result is None or not result.cancelled:
            self.waiting()


def watch_view(session: Session, single_keys: bool, clear: bool) -> WatchOutput:
    """The redrawn screen needs a terminal; --no-clear or a pipe keep the log form."""
    from theinference.output.report import console

    out = console()
    form = ScreenView if clear and out.is_terminal else LogView
    return form(out, session, single_keys)


class KeyReader:
    """Keys from the terminal (single keys, no Enter needed) or, when stdin is not a terminal,
    lines: r or an empty line reruns, a runs all stages, n the next stage, h a hint, q quits."""

    def __init__(self):
        self.fd = sys.stdin.fileno() if sys.stdin and not sys.stdin.closed else None
        self.single_keys = self.fd is not None and os.isatty(self.fd)
        self.stop = threading.Event()
        self.command: Callable[[str], None] = lambda _: None
        self._saved = None

    def start(self, command: Callable[[str], None]) -> None:
        self.command = command
        if self.fd is None:
            return
        if self.single_keys:
            import termios
            import tty

            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)  # keys arrive one by one; Ctrl-C still interrupts
        threading.Thread(target=self._read, daemon=True).start()

    def restore(self) -> None:
        self.stop.set()
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
        if key.lower() in KEYS:
            self.command(KEYS[key.lower()])
