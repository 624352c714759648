"""The terminal report: the only module that imports rich. It reads results, never computes."""

import math

from rich.console import Console, Group
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from theinference.compare import Comparison
from theinference.results import CaseResult, RunResult, StageResult, Status

STYLE = {
    Status.PASSED: ("✓", "green"),
    Status.FAILED: ("✗", "red"),
    Status.ERROR: ("!", "red"),
    Status.TIMEOUT: ("⏱", "red"),
    Status.TODO: ("○", "yellow"),
    Status.SKIPPED: ("-", "dim"),
}


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_header(
    out: Console, course: str, weights: str, stages: list[str], trigger: str = ""
) -> None:
    if trigger:
        out.rule(escape(trigger), style="dim")
    out.print(f"[bold]theinference[/] · course {escape(course)} · weights {escape(weights)}")
    out.print(f"[dim]stages: {', '.join(stages)}[/]")


def print_run(out: Console, run: RunResult) -> None:
    for stage in run.stages:
        out.print(stage_block(stage))
    for note in run.notes:
        out.print(Text("note: " + note, style="yellow"))
    out.print(summary_line(run))


def print_cancelled(out: Console, reason: str) -> None:
    out.print(Text(f"run stopped: {reason}", style="dim"))


def print_watching(out: Console, keys: bool) -> None:
    how = "r or Enter: rerun · a: all stages · q: quit" if keys else "Enter: rerun"
    out.print(Text(f"watching for changes · {how} · Ctrl-C: quit", style="dim"))


def stage_block(stage: StageResult) -> Group:
    mark, colour = STYLE[stage.status]
    passed = sum(c.status == Status.PASSED for c in stage.cases)
    head = Text.assemble(
        (f"{mark} {stage.slug}", f"bold {colour}"),
        f"  {stage.title}  ",
        (stage.status.value.upper(), colour),
    )
    if stage.status == Status.SKIPPED:
        return Group(Text(""), head, Text(f"    {stage.reason}", style="dim"))
    head.append(f"  {passed}/{len(stage.cases)} cases · {stage.seconds:.1f} s", style="dim")
    if stage.status == Status.TODO and all(c.status == Status.TODO for c in stage.cases):
        return Group(
            Text(""), head, Text(f"    not started: {stage.cases[0].message}", style="yellow")
        )
    blocks, seen = [], {}
    for case in stage.cases:
        blocks.append(case_block(case, repeat_of=seen.get(case.traceback)))
        if case.traceback:
            seen.setdefault(case.traceback, case.name)
    return Group(Text(""), head, *blocks, *stage_footer(stage))


def stage_footer(stage: StageResult) -> list:
    """The stage's diagnosis, and the cases this run left out."""
    lines = []
    if stage.hint:
        lines.append(Text("    " + stage.hint, style="cyan"))
    elif stage.diagnosed:
        lines.append(Text("    no known bug matches these answers", style="dim"))
    if stage.not_run:
        lines.append(Text(f"    {len(stage.not_run)} case(s) not run", style="dim"))
    return lines


def indented(renderable) -> Padding:
    return Padding(renderable, (0, 0, 0, 6), expand=False)


def case_block(case: CaseResult, repeat_of: str | None = None) -> Group | Text:
    mark, colour = STYLE[case.status]
    line = Text.assemble(("  " + mark + " ", colour), case.name)
    if case.status == Status.PASSED:
        line.append(f"  {passed_summary(case)} · {case.student_seconds:.2f} s", style="dim")
        return line
    line.append(f"  {case.status.value}", style=colour)
    parts: list = [line]
    if repeat_of is not None:
        parts.append(indented(Text(f"{case.message} (the same traceback as '{repeat_of}')")))
    elif case.traceback:  # its last line is the message
        parts.append(indented(Text(case.traceback.rstrip(), style="red")))
    elif case.message:
        parts.append(indented(Text(case.message)))
    if case.steps:
        parts.append(indented(step_strip(case.steps)))
    if case.tokens and case.tokens.get("first_divergence") is not None:
        parts.append(indented(token_strip(case.tokens)))
    for comparison in case.comparisons:
        parts.append(indented(comparison_table(comparison)))
    if case.fingerprinted and case.suspected_bug is None:
        parts.append(indented(Text("no known bug matches this answer", style="dim")))
    if case.hint:
        parts.append(indented(Text("hint: " + case.hint, style="cyan")))
    for name, text in (("stdout", case.stdout), ("stderr", case.stderr)):
        if text.strip():
            parts.append(indented(Text(f"your {name}:\n{text.rstrip()}", style="dim")))
    return Group(*parts)


def passed_summary(case: CaseResult) -> str:
    if case.tokens is not None:
        ties = len(case.tokens.get("near_ties", []))
        extra = f", {ties} near-tie(s) accepted" if ties else ""
        return f"{len(case.tokens['yours'])} tokens match the recompute{extra}"
    if not case.comparisons:
        return case.message or "as expected"
    worst = max(case.comparisons, key=lambda c: c.worst)
    steps = f" over {len(case.steps)} steps" if case.steps else ""
    noise = f" ({worst.noise_multiple:.2g}x the float32 noise)" if worst.noise else ""
    return f"worst error {worst.worst:.2g}x tolerance{steps}{noise}"


SPARKS = "▁▂▃▄▅▆▇█"


def step_strip(steps: list[float]) -> Group:
    """Pass/fail per step, then each step's worst error on a log scale (1 = the tolerance)."""
    marks = Text("steps  ")
    for worst in steps:
        marks.append("✓" if worst <= 1 else "✗", style="green" if worst <= 1 else "red")
    logs = [math.log10(max(s, 1e-4)) for s in steps]
    low, high = min(logs), max(max(logs), 0.0)
    span = (high - low) or 1.0
    chart = Text("error  ")
    for worst, lg in zip(steps, logs, strict=True):
        chart.append(
            SPARKS[round((lg - low) / span * (len(SPARKS) - 1))],
            style="green" if worst <= 1 else "red",
        )
    chart.append(f"  {min(steps):.2g}x .. {max(steps):.2g}x the tolerance (log scale)", style="dim")
    return Group(marks, chart)


def token_strip(tokens: dict) -> Table:
    """Your tokens against the recompute's around the first divergence."""
    first = tokens["first_divergence"]
    lo, hi = max(first - 4, 0), min(first + 3, len(tokens["yours"]))
    t = Table(show_header=False, box=None, padding=(0, 1, 0, 0))
    t.add_column(style="dim")
    for _ in range(lo, hi):
        t.add_column(justify="right")
    for name, row in (("yours", tokens["yours"]), ("recompute", tokens["expected"])):
        cells = [Text(str(row[i]), style="bold red" if i == first else "") for i in range(lo, hi)]
        t.add_row(name, *cells)
    t.add_row("step", *[Text(str(i), style="dim") for i in range(lo, hi)])
    return t


def comparison_table(c: Comparison) -> Table:
    t = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("compared", f"{c.label} {list(c.shape)}")
    t.add_row("mismatched", f"{c.mismatched} / {c.total} ({c.mismatched_percent:.1f}%)")
    t.add_row("max abs diff", f"{c.max_abs:.4g} at {list(c.max_abs_index)}")
    t.add_row("max rel diff", f"{c.max_rel:.4g} at {list(c.max_rel_index)}")
    t.add_row("worst", f"{c.worst:.3g}x the tolerance at {list(c.worst_index)}")
    if c.argmax_expected is not None:
        same = "same" if c.argmax_actual == c.argmax_expected else "DIFFERENT"
        t.add_row("argmax", f"yours {c.argmax_actual}, expected {c.argmax_expected} ({same})")
    t.add_row("tolerance", str(c.tolerance))
    if c.noise is not None:
        t.add_row(
            "float32 noise",
            f"{c.noise:.3g}: a correct cached path differs this much; "
            f"yours differs {c.noise_multiple:.3g}x that",
        )
    return t


def summary_line(run: RunResult) -> Text:
    counts: dict[Status, int] = {}
    for s in run.stages:
        counts[s.status] = counts.get(s.status, 0) + 1
    parts = [f"{n} {status.value}" for status, n in counts.items()]
    colour = "green" if run.passed else "red"
    return Text.assemble(
        ("\n" + ("PASSED" if run.passed else "NOT PASSED"), f"bold {colour}"),
        f" · {', '.join(parts)} · weights {run.weights_label} · {run.seconds:.1f} s",
    )


def print_error(message: str) -> None:
    # never hard-wrapped: paths in it must survive copy and paste
    console(stderr=True).print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)


def print_stages(out: Console, rows: list[tuple[str, str, str, str]]) -> None:
    t = Table(box=None)
    t.add_column("stage", style="bold", no_wrap=True)
    t.add_column("title")
    t.add_column("requires", style="dim", no_wrap=True)
    t.add_column("your last result", no_wrap=True)
    for slug, title, requires, last in rows:
        colour = STYLE[Status(last)][1] if last in Status._value2member_map_ else "dim"
        t.add_row(slug, title, requires, Text(last, style=colour))
    out.print(t)


def print_verify(out: Console, rows: list, weights: str) -> None:
    """The verify table: margins as multiples of the tolerance (reference: below 1; a bug:
    far above 1, or not numeric when it raised or returned the wrong shape)."""
    t = Table(title=f"theinference verify · weights {weights}", box=None)
    for name in ("stage", "solution", "status", "error / tolerance", "named as", "verdict"):
        t.add_column(name, no_wrap=name != "named as")
    for r in rows:
        margin = "-" if r.worst is None else f"{r.worst:.3g}x"
        label = "largest " + margin if r.subject == "reference" else "smallest " + margin
        named = r.named or ("-" if r.expected_name is None else "nothing")
        verdict = Text("ok", style="green") if r.ok else Text("WRONG", style="bold red")
        t.add_row(r.stage, r.subject, r.status.value, label, named, verdict)
    out.print(t)
    bad = sum(not r.ok for r in rows)
    out.print(
        Text(f"{len(rows) - bad}/{len(rows)} as expected", style="green" if not bad else "red")
    )


def print_bench(out: Console, result) -> None:
    """ms per token, recompute against cached, as a table and a bar chart of the speedup."""
    t = Table(
        title=f"ms per token (median, low-high of {result.repeats}) · {result.new_tokens} new "
        f"tokens · weights {result.weights_label}",
        box=None,
    )
    for name in ("prompt", "recompute", "cached", "speedup", "oracle", "yours/oracle"):
        t.add_column(name, justify="right", no_wrap=True)
    for r in result.rows:
        t.add_row(
            str(r.length),
            f"{r.recompute_ms.median:.1f} ({r.recompute_ms.low:.1f}-{r.recompute_ms.high:.1f})",
            f"{r.cached_ms.median:.1f} ({r.cached_ms.low:.1f}-{r.cached_ms.high:.1f})",
            f"{r.speedup:.1f}x" if r.cached_ms.median > 0 else "n/a (noise)",
            f"{r.oracle_cached_ms:.1f}",
            f"{r.versus_oracle:.2f}x",
        )
    out.print(t)
    top = max((r.speedup for r in result.rows), default=1.0)
    for r in result.rows:
        bar = "█" * max(1, round(40 * r.speedup / top))
        out.print(
            Text.assemble(
                (f"{r.length:>6} ", "dim"),
                (bar, "green"),
                f" {r.speedup:.1f}x faster with the cache",
            )
        )
