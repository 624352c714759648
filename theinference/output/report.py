"""The terminal report, in the log form: it reads results (the diagnosis included) and draws
them; it works nothing out."""

from rich.console import Console, Group
from rich.markup import escape
from rich.text import Text

from theinference.output.cases import (
    STYLE,
    alike_block,
    case_block,
    case_details,
    grouped,
    indented,
    not_started,
)
from theinference.output.consoles import console
from theinference.output.heatmap import map_lines
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.text import inert_copy, terminal_text


def print_header(
    out: Console, course: str, weights: str, stages: list[str], trigger: str = ""
) -> None:
    course, weights, trigger = map(terminal_text, (course, weights, trigger))  # file names
    if trigger and out.is_terminal:
        out.rule(escape(trigger), style="dim")
    elif trigger:
        out.print(Text(f"── {trigger} ──", style="dim"))
    out.print(f"[bold]theinference[/] · course {escape(course)} · weights {escape(weights)}")
    out.print(f"[dim]stages: {', '.join(stages)}[/]")


def print_run(out: Console, run: RunResult, next_step: str = "") -> None:
    seen: dict[str, str] = {}
    for stage in run.stages:
        out.print(stage_block(stage, seen))
    print_run_end(out, run, next_step)


def print_run_end(out: Console, run: RunResult, next_step: str = "") -> None:
    run = inert_copy(run, terminal_text)
    for note in run.notes:
        out.print(Text("note: " + note, style="yellow"))
    out.print(summary_line(run))
    if next_step:
        out.print(Text(next_step, style="bold"))


def print_cancelled(out: Console, reason: str) -> None:
    out.print(Text(f"run stopped: {reason}", style="dim"))


def print_watching(out: Console, keys: bool) -> None:
    how = "r or Enter: rerun · a: all stages · n: next stage · h: hint · q: quit"
    out.print(Text(f"watching for changes · {how if keys else how + ' (then Enter)'}", style="dim"))


def stage_head(stage: StageResult) -> Text:
    mark, colour = STYLE[stage.status]
    passed = sum(c.status == Status.PASSED for c in stage.cases)
    head = Text.assemble(
        (f"{mark} {stage.slug}", f"bold {colour}"),
        f"  {stage.title}  ",
        (stage.status.value.upper(), colour),
    )
    if stage.status != Status.SKIPPED:
        # left out by --quick or --case, or after a first failure in watch mode
        partial = f" ({len(stage.not_run)} not run)" if stage.partial and stage.not_run else ""
        head.append(
            f"  {passed}/{len(stage.cases)} cases{partial} · {stage.seconds:.1f} s", style="dim"
        )
    return head


def early_failure(slug: str, case: CaseResult, shown: set[str]) -> Text | None:
    """The line that shows a stage's first failing case the moment it is judged (None for
    a passing case, or once the stage's first is shown): the stage's verdict, its suspected
    bug and the case in full follow when the stage's other cases, the long ones last, are
    done."""
    if case.status not in EARLY or slug in shown:
        return None
    shown.add(slug)
    mark, colour = STYLE[case.status]
    first = (terminal_text(case.message or "").strip().splitlines() or [""])[0]
    line = Text.assemble((f"{mark} {slug}", f"bold {colour}"), "  ",
                         (terminal_text(case.name), colour), f"  {case.status.value.upper()}")
    if first:
        line.append(f": {first}", style="dim")
    line.append("  · its other cases are running, the stage's verdict follows", style="dim")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


EARLY = {Status.FAILED, Status.ERROR, Status.TIMEOUT}  # a case shown before its stage ends


def stage_block(stage: StageResult, seen: dict[str, str] | None = None) -> Group:
    """A stage in the log form. `seen` (traceback -> where it was first shown) spans the run,
    so an error every case shares is shown once per stage, and an import failure once per run."""
    seen = {} if seen is None else seen
    stage = inert_copy(stage, terminal_text)  # the student's text shown, never acted on
    head = stage_head(stage)
    if stage.status == Status.SKIPPED:
        return Group(Text(""), head, Text(f"    {stage.reason}", style="dim"))
    if stage.status == Status.TODO and all(c.status == Status.TODO for c in stage.cases):
        return Group(
            Text(""), head, Text(f"    {not_started(stage)}", style="yellow")
        )
    if stage.shared_error:
        return Group(Text(""), head, *shared_error_block(stage, seen))
    blocks = case_blocks(stage, seen)
    return Group(Text(""), head, *diagnosis_lines(stage), *blocks, *map_lines(stage))


def case_blocks(stage: StageResult, seen: dict[str, str]) -> list:
    """Each case in course order, except that failures like an earlier one (same_way) sit in
    one table under it. A case's own hint is shown once, and not where the stage's diagnosis
    speaks for the case (StageResult.speaks_for): the diagnosis above says what to do."""
    blocks, hints = [], {stage.hint}
    for case, alike in grouped(stage):
        show_hint = not stage.speaks_for(case) and case.hint not in hints
        blocks.append(case_block(case, seen.get(case.traceback), show_hint=show_hint))
        hints.add(case.hint)
        if alike:
            blocks.append(alike_block(alike))
        if case.traceback:
            seen.setdefault(case.traceback, f"'{case.name}'")
    return blocks


def shared_error_block(stage: StageResult, seen: dict[str, str]) -> list:
    errors = [c for c in stage.cases if c.status == Status.ERROR]
    shared = (errors[0].traceback or errors[0].message).strip()
    names = "; ".join(c.name for c in errors)  # case names may hold commas
    said = Text(f"    every case that ran ({len(errors)}: {names}) raised the same error", "red")
    if shared in seen:
        return [said, indented(Text(f"{errors[0].message} (shown above, {seen[shared]})"))]
    seen[shared] = f"stage {stage.slug}"
    return [said, *diagnosis_lines(stage), *case_details(errors[0], show_hint=False)]


def diagnosis_lines(stage: StageResult, with_bug: bool = True) -> list:
    """The stage's diagnosis, first: the suspected bug (unless said already) and its hint,
    then the worst case."""
    if stage.status in (Status.PASSED, Status.TODO, Status.SKIPPED):
        return []
    lines = []
    if stage.bug_name and with_bug:
        lines.append(Text(f"    suspected bug: {stage.bug_name}", style="bold magenta"))
    elif stage.diagnosed and not stage.bug_name:
        lines.append(Text("    no known bug matches these answers", style="dim"))
    if stage.hint:
        lines.append(indented(Text("hint: " + stage.hint, style="cyan")))
    if (worst := stage.case(stage.worst_case)) is not None:
        lines.append(Text(f"    worst case: {worst.name}, {worst.worst:.3g}x the tolerance"))
    return lines


def summary_line(run: RunResult) -> Text:
    counts: dict[Status, int] = {}
    for s in run.stages:
        counts[s.status] = counts.get(s.status, 0) + 1
    parts = [f"{n} {status.value}" for status, n in counts.items()]
    colour = "green" if run.passed else "red"
    return Text.assemble(
        ("\n" + ("PASSED" if run.passed else "NOT PASSED"), f"bold {colour}"),
        f" · {', '.join(parts)} · weights {run.weights_label} · sandbox {run.sandbox}"
        f" · {run.seconds:.1f} s",
    )


def print_notice(message: str) -> None:
    """A wait about to begin (the weights being made), on stderr: stdout may be a result."""
    console(stderr=True).print(Text(terminal_text(message), style="dim"), soft_wrap=True)


def print_error(message: str) -> None:
    # never hard-wrapped: paths in it must survive copy and paste
    line = Text("error: ", style="bold red") + Text(terminal_text(message))
    console(stderr=True).print(line, soft_wrap=True)


def next_stage(run: RunResult, order: list[str]) -> str | None:
    """The stage after the last one this run graded, when every stage it graded passed."""
    if not run.stages or not run.passed:
        return None
    last = order.index(run.stages[-1].slug) if run.stages[-1].slug in order else -1
    return order[last + 1] if last + 1 < len(order) else None


def next_step_line(run: RunResult, order: list[str]) -> str:
    """What to do once everything graded passed ("" while something fails)."""
    if not run.stages or not run.passed:
        return ""
    following = next_stage(run, order)
    if following is None:
        return "every stage passes: the KV cache is complete"
    return f"next stage: {following} · theinference test --stage {following} --watch"
