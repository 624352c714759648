"""A check's result inline in a notebook (`check("STAGE")`): each stage's line, then for a
stage that did not pass its first failing case, the suspected bug, the hint and the error map
as SVG, and the whole report folded below. One HTML fragment, its style scoped to itself (a
notebook's page is shared) and nothing fetched; the text form is the terminal's report."""

import io
import textwrap

from rich.console import Console, Group

from theinference.output.heatmap import map_case
from theinference.output.html_page import map_figure
from theinference.output.plain import not_started
from theinference.output.report import case_details, print_run
from theinference.results import RunResult, StageResult, Status, where_text
from theinference.results.text import html_text, inert_copy, terminal_text

SCOPE = "theinference-check"
STYLE = f""".{SCOPE}{{font-family:system-ui,sans-serif;line-height:1.4}}
.{SCOPE} h3{{font-size:1.05em;margin:.8em 0 .3em}}
.{SCOPE} pre{{background:#f4f4f4;padding:.6em;overflow-x:auto;font-size:12px;white-space:pre}}
.{SCOPE} .passed{{color:#2e7d32}}.{SCOPE} .failed,.{SCOPE} .error,.{SCOPE} .timeout{{color:#c62828}}
.{SCOPE} .todo{{color:#a76d00}}.{SCOPE} .skipped{{color:#777}}.{SCOPE} dt{{font-weight:bold}}
.{SCOPE} svg text{{font:11px monospace}}.{SCOPE} .note{{color:#a76d00}}"""
SHOWN = {Status.FAILED, Status.ERROR, Status.TIMEOUT}

TEXT_WIDTH = 100  # columns of a check's text report


def check_html(run: RunResult, notes: list[str]) -> str:
    """The fragment a check cell shows; `notes` are the check's own (cells skipped...)."""
    verdict = "PASSED" if run.passed else "NOT PASSED"
    partial = " · partial: some cases did not run, not a full pass" if run.partial else ""
    head = (
        f'<p><b class="{"passed" if run.passed else "failed"}">theinference · {verdict}</b> · '
        f"weights {html_text(run.weights_label)} · sandbox {html_text(run.sandbox)} · "
        f"{run.seconds:.1f} s{partial}</p>"
    )
    said = "".join(f'<p class="note">note: {html_text(n)}</p>' for n in [*notes, *run.notes])
    stages = "".join(stage_html(s) for s in run.stages)
    report = (f"<details><summary>the whole report</summary>"
              f"<pre>{html_text(report_text(run))}</pre></details>")
    return f'<div class="{SCOPE}"><style>{STYLE}</style>{head}{said}{stages}{report}</div>'


def stage_html(stage: StageResult) -> str:
    status = stage.status.value
    passed = sum(c.status == Status.PASSED for c in stage.cases)
    head = (f'<h3 class="{status}">{html_text(stage.slug)} · {html_text(stage.title)} · '
            f"{status.upper()} · {passed}/{len(stage.cases)} cases</h3>")
    said = [("skipped", stage.reason), ("suspected bug", stage.bug_name),
            ("first departs at", where_text(stage.where)), ("hint", stage.hint)]
    terms = "".join(f"<dt>{k}</dt><dd>{html_text(v)}</dd>" for k, v in said if v)
    shown = map_case(stage)
    figure = "" if shown is None else map_figure(shown.name, shown.error_map)
    return (f'<section class="stage" id="{html_text(stage.slug)}">{head}{first_case(stage)}'
            f"<dl>{terms}</dl>{figure}</section>")


def first_case(stage: StageResult) -> str:
    """The first case that did not pass, as the terminal shows it (todo: what is missing)."""
    stage = inert_copy(stage, terminal_text)  # the student's text shown, never acted on
    if stage.status == Status.TODO:
        return f"<p>{html_text(not_started(stage))}</p>"
    case = stage.case(stage.first_case) or next(
        (c for c in stage.cases if c.status in SHOWN), None)
    if case is None:
        return ""
    details = textwrap.dedent(as_text(Group(*case_details(case, show_hint=False)))).strip("\n")
    return (f'<p>first failing case: <b class="case">{html_text(case.name)}</b> · '
            f"{html_text(case.status.value)}</p><pre>{html_text(details)}</pre>")


def report_text(run: RunResult) -> str:
    """What `theinference test` prints, without colours."""
    out = text_console()
    print_run(out, run)
    return out.file.getvalue()


def as_text(renderable) -> str:
    out = text_console()
    out.print(renderable)
    return "\n".join(line.rstrip() for line in out.file.getvalue().splitlines())


def text_console() -> Console:
    """A console writing plain text to a string: in a kernel rich would display instead."""
    return Console(file=io.StringIO(), width=TEXT_WIDTH, color_system=None, highlight=False,
                   force_jupyter=False, force_terminal=False, emoji=False)


def check_text(run: RunResult) -> str:
    """A check's result where HTML is not shown: the terminal's report, without colour."""
    return report_text(run)


def problem_html(message: str, notes: list[str]) -> str:
    """A check that could not run (an unknown stage, weights missing), and why."""
    said = "".join(f'<p class="note">note: {html_text(n)}</p>' for n in notes)
    return (f'<div class="{SCOPE}"><style>{STYLE}</style><p><b class="error">theinference: '
            f"cannot check</b>: {html_text(message)}</p>{said}</div>")
