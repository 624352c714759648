"""Watch mode's screen: the current state, not a log (rustlings' manner).

Every run redraws it. Passed stages and cases collapse to one line each; the stage's verdict,
its suspected bug with the hint, the first failing case in full (its allclose table) and the
next thing to do are pinned at the bottom, the last thing the eye lands on.
"""

import re

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.segment import Segment
from rich.text import Text

from theinference.output.cases import not_started
from theinference.output.heatmap import map_lines
from theinference.output.report import (
    STYLE,
    case_details,
    early_failure,
    indented,
    next_step_line,
    stage_head,
    summary_line,
)
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.text import inert_copy, terminal_text

KEYS = "r: rerun · a: all stages · n: next · h: hint · q: quit"  # 80 columns, with Enter's
FOCUS_LINES = 8  # the first failing case's detail worth keeping when the screen is small
LIST_ITEM = re.compile(r"([-*]|\d+[.)]) ")
OUTPUT_LINES = 12  # the student's captured output shown on the screen; the log form has all


def draw(
    out: Console, header: Group, run: RunResult, order: list[str], keys: bool, fit: bool = False
) -> None:
    """The whole screen for a finished run, cleared first when out is a terminal. `fit`: the
    first failing case's detail is cut to what the terminal's height leaves, so the header
    and the stage lines stay on screen (the log form has it whole)."""
    run = inert_copy(run, terminal_text)  # the student's text shown, never acted on
    focus = next((s for s in run.stages if s.status != Status.PASSED), None)
    top, bottom = screen_parts(header, run, fit=False), end_parts(run, focus, order, keys, fit)
    if fit and sum(height(out, part) for part in top + bottom) > out.height - 1 - FOCUS_LINES:
        top = screen_parts(header, run, fit=True)
    detail = focus_block(focus) if focus is not None else Group()
    if fit:  # one line is left for the cursor under the last
        room = out.height - 1 - sum(height(out, part) for part in top + bottom)
        detail = Cut(detail, room, focus.slug if focus is not None else "")
    if out.is_terminal:
        out.clear()
    for part in (*top, detail, *bottom):
        out.print(Group(part))  # a bare Text printed loses its no_wrap (print joins texts)


def screen_parts(header: Group, run: RunResult, fit: bool) -> list:
    """The header and a few lines per stage (`fit`: a line per stage's cases)."""
    return [header, *(stage_summary(stage, compact=fit) for stage in run.stages), Text("")]


def end_parts(run: RunResult, focus, order: list[str], keys: bool, fit: bool) -> list:
    """The notes (`fit`: a line each), the summary, the verdict and the keys."""
    notes = [one_line(Text("note: " + note, style="yellow"), fit) for note in run.notes]
    keys_line = Text(f"watching for changes · {KEYS if keys else KEYS + ' (then Enter)'}", "dim")
    return [*notes, one_line(summary_line(run), fit), verdict_block(focus, run, order), keys_line]


def height(out: Console, renderable) -> int:
    """How many lines a renderable takes at the console's width."""
    return len(out.render_lines(renderable, out.options, pad=False))


class Cut:
    """A renderable's first lines, as many as `room` allows, the last of them saying how many
    more there are and where to read them."""

    def __init__(self, renderable, room: int, slug: str):
        self.renderable, self.room, self.slug = renderable, room, slug

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.renderable, options, pad=False)
        if len(lines) <= self.room:
            kept, cut = lines, 0
        else:
            kept = lines[: max(self.room - 1, 0)]
            cut = len(lines) - len(kept)
        for line in kept:
            yield from line
            yield Segment.line()
        if cut and self.room > 0:
            yield Text(f"    … {cut} more lines: `theinference test --stage {self.slug}` "
                       "prints them", style="dim", no_wrap=True, overflow="ellipsis")


def stage_summary(stage: StageResult, compact: bool = False) -> Group:
    """A stage in a few lines: passed cases in one, each other case in one (`compact`: all
    the others in one too, every line cut to the width)."""
    stage = inert_copy(stage, terminal_text)
    head = one_line(stage_head(stage), compact)
    if stage.status in (Status.PASSED, Status.SKIPPED) or not stage.cases:
        return Group(head, *([Text(f"    {stage.reason}", "dim")] if stage.reason else []))
    passed = [c.name for c in stage.cases if c.status == Status.PASSED]
    lines = [head]
    if passed:
        said = Text(f"    ✓ {len(passed)} passed: {', '.join(passed)}", "green")
        lines.append(one_line(said, compact))
    others = [c for c in stage.cases if c.status != Status.PASSED]
    if stage.shared_error or compact:  # one line for them all
        name = f"{len(others)} cases" if stage.shared_error else ""
        lines.append(case_line(others[0], name) if name or len(others) == 1 else
                     one_line(Text(f"    ✗ {len(others)} not passed: "
                                   + ", ".join(c.name for c in others), "red"), True))
        return Group(*lines)
    lines += [case_line(case) for case in others]
    return Group(*lines)


def one_line(text: Text, cut: bool = True) -> Text:
    """The text on one line, cut to the width with an ellipsis (when `cut`)."""
    if cut:
        text.no_wrap, text.overflow = True, "ellipsis"
    return text


def case_line(case: CaseResult, name: str = "") -> Text:
    mark, colour = STYLE[case.status]
    first = (case.message or "").strip().splitlines()[:1]
    line = Text.assemble((f"    {mark} {name or case.name}", colour), f"  {case.status.value}")
    if first:
        line.append(f": {first[0]}", style="dim")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def focus_block(stage: StageResult) -> Group:
    """The first case that did not pass, in full (an error every case shares, once)."""
    if stage.status in (Status.TODO, Status.SKIPPED):
        return Group()
    case = stage.case(stage.first_case)
    if case is None:
        return Group()
    title = "every case" if stage.shared_error else f"case {case.name}"
    rule = Text(f"── {stage.slug} · {title} " + "─" * 20, style="dim")
    return Group(rule, *case_details(trim_output(case), show_hint=False), *map_lines(stage))


def trim_output(case: CaseResult) -> CaseResult:
    from dataclasses import replace

    def tail(text: str) -> str:
        lines = text.rstrip().splitlines()
        cut = len(lines) - OUTPUT_LINES
        return "\n".join(([f"... ({cut} lines above)"] if cut > 0 else []) + lines[-OUTPUT_LINES:])

    return replace(case, stdout=tail(case.stdout), stderr=tail(case.stderr))


def verdict_block(focus: StageResult | None, run: RunResult, order: list[str]) -> Group:
    """The last lines: the verdict, the suspected bug with its hint, what to do next."""
    if focus is None:
        last = run.stages[-1] if run.stages else None
        head = Text.assemble(("✓ ", "green"), (last.slug if last else "", "bold green"))
        head.append("  PASSED", style="bold green")
        return Group(head, Text(next_step_line(run, order) + " · press n to go there", "bold"))
    mark, colour = STYLE[focus.status]
    head = Text.assemble((f"{mark} {focus.slug}  ", f"bold {colour}"))
    head.append(focus.status.value.upper(), style=f"bold {colour}")
    lines = [head]
    if focus.status == Status.TODO:
        lines.append(Text(not_started(focus), "yellow"))
        lines.append(Text(f"next: write it, then save · h: {focus.slug}'s guidance", "bold"))
        return Group(*lines)
    if focus.status == Status.SKIPPED:
        return Group(head, Text(focus.reason, "dim"))
    if (worst := focus.case(focus.worst_case)) is not None:
        lines.append(Text(f"worst case: {worst.name}, {worst.worst:.3g}x the tolerance"))
    if focus.bug_name:
        lines.append(Text(f"suspected bug: {focus.bug_name}", "bold magenta"))
    if focus.hint:
        lines.append(Text("hint: " + focus.hint, "cyan"))
    lines.append(Text("next: fix it and save · h: the stage's guidance", "bold"))
    return Group(*lines)


def hint_block(slug: str, title: str, guidance: str, stage: StageResult | None) -> Group:
    """Key h: the stage's guidance from the course, and the diagnosis of its last run."""
    parts = [Text(f"── hint: {slug} · {title} ──", "bold cyan"), Text(reflowed(guidance))]
    stage = inert_copy(stage, terminal_text)
    if stage is not None and stage.status not in (Status.PASSED, Status.TODO, Status.SKIPPED):
        if stage.bug_name:
            parts.append(Text(f"your last run: suspected bug: {stage.bug_name}", "magenta"))
        if stage.hint:
            parts.append(indented(Text(stage.hint, "cyan")))
    return Group(*parts)


def reflowed(text: str) -> str:
    """Prose written wrapped at one width, made whole paragraphs and list items for the
    terminal to wrap at its own. A line joins the one before unless either is blank, it starts
    a list item, or it is indented outside one (a block kept as written)."""
    lines: list[str] = []
    in_item = False
    for line in text.strip("\n").splitlines():
        item = bool(LIST_ITEM.match(line))
        indented = line[:1].isspace()
        joins = lines and lines[-1].strip() and line.strip() and not item \
            and (not indented or in_item)
        if joins:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
            in_item = item
    return "\n".join(lines)


def header(course: str, weights: str, trigger: str) -> Group:
    import time

    when = time.strftime("%H:%M:%S")
    course, weights, trigger = map(terminal_text, (course, weights, trigger))  # file names
    return Group(
        Text.assemble(("theinference", "bold"), f" · course {course} · weights {weights}"),
        Text(f"{trigger or 'first run'} · {when}", "dim"),
    )


class WatchScreen:
    """One watched run on the screen: cleared at its start, the header, a live status line
    and each stage collapsed as it finishes; redrawn whole when the run is over."""

    def __init__(self, out: Console, session, keys: bool):
        from theinference.output.terminal import LiveStatus

        self.out = out
        self.course = str(session.course.root)
        self.weights = session.weights.label
        self.order = [s.slug for s in session.all_stages]
        self.keys = keys
        self.status = LiveStatus(out)
        self.top = Group()

    def listener(self, trigger: str, cancel):
        from theinference.output.terminal import RunProgress, tee
        from theinference.results.events import RunStarted

        self.top = header(self.course, self.weights, trigger)

        def stage_done(stage: StageResult) -> None:
            if not cancel.is_set():  # a stopped run's last stage is the kill, not a verdict
                self.out.print(stage_summary(stage))

        def clear_first(event) -> None:
            if isinstance(event, RunStarted):
                self.out.clear()
                self.out.print(self.top)

        shown: set[str] = set()  # stages whose first failing case is on screen

        def case_done(slug: str, case: CaseResult) -> None:
            line = early_failure(slug, case, shown)
            if line is not None and not cancel.is_set():
                self.out.print(line)

        progress = RunProgress(self.status, on_stage=stage_done, on_case=case_done)
        return tee(clear_first, progress)

    def draw(self, run: RunResult) -> None:
        draw(self.out, self.top, run, self.order, self.keys, fit=True)

    def close(self) -> None:
        self.status.stop()
