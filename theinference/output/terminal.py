"""The terminal while a run goes: a live status line (the running stage and case, its elapsed
time, cases done and left), and the log form printed stage by stage as stages finish.

Both are listeners (events.py): the run tells them what happens and never prints itself.
"""

import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from theinference.results.events import (
    CaseFinished,
    CaseStarted,
    Event,
    RunFinished,
    RunStarted,
    StageFinished,
    StageStarted,
)


class LiveStatus:
    """One line at the bottom of a terminal, redrawn four times a second, gone when the run
    ends. Outside a terminal it draws nothing (a log needs no spinner)."""

    def __init__(self, out: Console, what: str = "starting"):
        self.out = out
        self.what = what
        self.detail = ""
        self.since = time.monotonic()
        self.done = self.total = 0
        self.spinner = Spinner("dots", style="cyan")
        self.live: Live | None = None
        self.lock = threading.Lock()

    def start(self) -> "LiveStatus":
        if self.out.is_terminal and self.live is None:
            self.live = Live(self, console=self.out, refresh_per_second=4, transient=True)
            self.live.start()
        return self

    def stop(self) -> None:
        with self.lock:
            live, self.live = self.live, None
        if live is not None:
            live.stop()

    def show(self, what: str, detail: str = "", done: int = 0, total: int = 0) -> None:
        self.what, self.detail, self.done, self.total = what, detail, done, total
        self.since = time.monotonic()

    def __rich__(self) -> Table:
        line = Text.assemble((self.what, "bold"), f"  {self.detail}" if self.detail else "")
        line.append(f"  {time.monotonic() - self.since:.1f} s", style="cyan")
        if self.total:
            left = self.total - self.done
            line.append(f"  · {self.done} done, {left} left", style="dim")
        grid = Table.grid(padding=(0, 1))
        grid.add_row(self.spinner, line)
        return grid


class RunProgress:
    """A run's events -> the live status line; each finished stage is handed to `on_stage`
    (printed above the status line) and the finished run to `on_run`."""

    def __init__(
        self,
        status: LiveStatus,
        on_stage: Callable = lambda stage: None,
        on_run: Callable = lambda run: None,
        label: str = "",
        on_case: Callable = lambda stage, case: None,
    ):
        self.status = status
        self.on_stage = on_stage
        self.on_run = on_run
        self.on_case = on_case  # (stage slug, CaseResult) as each case finishes
        self.label = f"{label} · " if label else ""  # e.g. which planted bug `verify` grades

    def __call__(self, event: Event) -> None:
        match event:
            case RunStarted(stages=stages):
                self.status.show("starting your code", f"{len(stages)} stage(s)")
                self.status.start()
            case StageStarted(slug=slug, cases=cases):
                self.status.show(self.label + slug, f"{cases} case(s)", 0, cases)
            case CaseStarted(stage=stage, case=case, index=index, total=total):
                detail = f"case {index + 1}/{total} {case}"
                self.status.show(self.label + stage, detail, index, total)
            case StageFinished(result=result):
                self.on_stage(result)
            case RunFinished(result=result):
                self.status.stop()
                self.on_run(result)
            case CaseFinished(stage=stage, result=result):
                self.on_case(stage, result)


def tee(*listeners) -> Callable[[Event], None]:
    """One listener that tells several, in order."""

    def tell(event: Event) -> None:
        for listener in listeners:
            listener(event)

    return tell


class LogReport:
    """The log form of `theinference test` (and of watch mode with --no-clear or without a
    terminal): the header at once, each stage as it finishes, the live status line meanwhile,
    then the summary and the next step."""

    def __init__(self, out: Console, order: list[str], cancel: threading.Event | None = None):
        self.out = out
        self.order = order  # every stage's slug, in course order
        self.cancel = cancel or threading.Event()  # set: the run is stale, print no more of it
        self.seen: dict[str, str] = {}  # tracebacks shown so far in this run
        self.failed_stages: set[str] = set()  # stages whose first failing case is shown
        self.status = LiveStatus(out)

    def listener(self) -> RunProgress:
        return RunProgress(self.status, on_stage=self._stage, on_case=self.early)

    def early(self, slug: str, case) -> None:
        """A stage's first failing case, on screen as soon as it is judged: its smallest, as
        cases run smallest first (the long ones beside each other: the first judged, as they
        are taken largest first); the stage's block follows when its other cases are done."""
        from theinference.output.report import early_failure

        line = early_failure(slug, case, self.failed_stages)
        if line is not None and not self.cancel.is_set():
            self.out.print(line)

    def _stage(self, stage) -> None:
        from theinference.output.report import stage_block

        if not self.cancel.is_set():  # a stopped run's last stage is the kill, not a verdict
            self.out.print(stage_block(stage, self.seen))

    def finish(self, run) -> None:
        from theinference.output.report import next_step_line, print_run_end

        print_run_end(self.out, run, next_step_line(run, self.order))

    def close(self) -> None:
        self.status.stop()


def verify_progress(out: Console) -> tuple[LiveStatus, Callable[[str], Callable]]:
    """`verify`: the live line names the solution being graded; outside a terminal one line
    per solution graded, so a long verify in CI is never silent."""
    status = LiveStatus(out, "verify: loading the weights").start()

    def listener_for(subject: str) -> RunProgress:
        def finished(run) -> None:
            status.start()  # the next solution's line
            if not out.is_terminal:
                verdicts = ", ".join(f"{s.slug} {s.status.value}" for s in run.stages)
                out.print(f"verify · {subject}: {verdicts} · {run.seconds:.1f} s")

        return RunProgress(status, on_run=finished, label=subject)

    return status, listener_for


def renderer(course: str, weights_label: str, order: list[str]):
    """The session's Renderer for a terminal: given a run's trigger and cancel flag, the
    listener that draws that run in the log form."""

    def for_run(trigger: str, cancel: threading.Event | None = None) -> "LogDrawing":
        log = LogReport(console_for_log(), order, cancel)
        return LogDrawing(log, course, weights_label, trigger)

    return for_run


def session_renderer(session) -> "Callable":
    """The terminal's Renderer for a prepared session: its course, weights and stage order."""
    order = [s.slug for s in session.all_stages]
    return renderer(str(session.course.root), session.weights.label, order)


def console_for_log() -> Console:
    from theinference.output.report import console

    return console()


class LogDrawing:
    """A run's events -> the log form: the header when it starts, each stage as it finishes
    (with the live status line meanwhile), the summary and the next step at the end."""

    def __init__(self, log: LogReport, course: str, weights_label: str, trigger: str):
        self.log, self.progress = log, log.listener()
        self.course, self.weights_label, self.trigger = course, weights_label, trigger

    def __call__(self, event: Event) -> None:
        from theinference.output.report import print_header

        if isinstance(event, RunStarted):
            stages = list(event.stages)
            print_header(self.log.out, self.course, self.weights_label, stages, self.trigger)
        self.progress(event)
        if isinstance(event, RunFinished) and not event.result.cancelled:
            self.log.finish(event.result)

    def close(self) -> None:
        self.log.close()
