"""Tables of the commands other than `test` (the stages list, verify's and bench's results)
and the speed figure."""

from rich.console import Console
from rich.table import Table
from rich.text import Text

from theinference.output.report import STYLE
from theinference.results import Status
from theinference.results.text import terminal_text


def print_stages(out: Console, rows: list[tuple[str, str, str, str]], in_course: bool) -> None:
    """The stages in course order; in a course, an arrow at the first one not yet passed
    (where the student is) and the command that works on it."""
    here = next((i for i, row in enumerate(rows) if row[3] != Status.PASSED.value), None)
    t = Table(box=None)
    t.add_column("", no_wrap=True)
    t.add_column("stage", style="bold", no_wrap=True)
    t.add_column("title")
    t.add_column("requires", style="dim", no_wrap=True)
    t.add_column("your last result", no_wrap=True)
    for i, (slug, title, requires, last) in enumerate(rows):
        colour = STYLE[Status(last)][1] if last in Status._value2member_map_ else "dim"
        mark = Text("→", style="bold cyan") if in_course and i == here else Text("")
        t.add_row(mark, slug, title, requires, Text(last, style=colour))
    out.print(t)
    if not in_course:
        return
    if here is None:
        out.print(Text("every stage passes: the KV cache is complete", style="bold green"))
    else:
        slug = rows[here][0]
        out.print(Text(f"you are at {slug}: theinference test --stage {slug} --watch", "bold"))


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


def print_speed(out: Console, speed: dict) -> None:
    """The speed figure (grading/speed.py): a ratio to the oracle, or why there is none."""
    if speed.get("status") != "measured":
        why = terminal_text(speed["reason"])  # may quote the student's exception
        out.print(Text(f"speed: not measured ({speed['status']}): {why}", style="dim"))
        return
    ratio = speed["ratio"]
    shown = "?" if ratio is None else f"{ratio:.2f}x"
    steps, generate = speed["workload"]["decode"], speed["workload"]["generate"]
    out.print(Text(
        f"speed: {shown} the oracle's cached decode step at a {steps[0]}-token context "
        f"({speed['decode_ms']:.1f} ms of CPU against {speed['oracle_decode_ms']:.1f} ms); "
        f"{speed['tokens_per_cpu_second']:.1f} tokens per CPU second generating {generate[1]} "
        f"(the oracle {speed['oracle_tokens_per_cpu_second']:.1f})", style="bold"))
