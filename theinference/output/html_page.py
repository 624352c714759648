"""A run as one standalone HTML page (`theinference test --html FILE`): each stage's verdict
and diagnosis (suspected bug, lesson, hint), its error map as inline SVG, and the terminal
report's text. No script, no stylesheet or font fetched: the page opens anywhere, offline."""

import io
import re

from rich.console import Console

from theinference.output.consoles import UNLIMITED, trimmed
from theinference.output.heatmap import COLOURS, FIRST, INK, LEGEND, RAMP, level, map_case
from theinference.output.report import print_run
from theinference.results import RunResult, StageResult, where_text
from theinference.results.text import html_text

CELL, LABEL, TOP = 22, 120, 8  # px: a cell's height, the row labels' room, the top margin
WIDEST, NARROWEST = 64, 10  # px: a cell's width, whatever the number of columns
PLOT = 640  # px across the cells at most
AXIS = 16  # px: the rotated name of the row axis, left of its labels

STYLE = """body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}
pre{background:#f4f4f4;padding:1em;font-size:12px;white-space:pre-wrap}
.passed{color:#2e7d32}.failed,.error,.timeout{color:#c62828}.todo{color:#a76d00}
.skipped{color:#777}dt{font-weight:bold}svg text{font:12px monospace}"""
# a figure and its unit stay on one line when the page wraps the report's text
FIGURE_UNIT = re.compile(r"(\d) (s|ms)\b")


def page(run: RunResult) -> str:
    verdict = "PASSED" if run.passed else "NOT PASSED"
    partial = " · partial run: some cases did not run, a pass here is not a full pass"
    stages = "".join(stage_section(s) for s in run.stages)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>theinference · {verdict}</title><style>{STYLE}</style></head><body>"
        f"<h1>theinference · {verdict}</h1><p>weights {html_text(run.weights_label)} · "
        f"sandbox {html_text(run.sandbox)} · {run.seconds:.1f} s{partial if run.partial else ''}"
        f"</p>{stages}"
        f"<h2>Report</h2><pre>{FIGURE_UNIT.sub(unbroken, html_text(report_text(run)))}</pre>"
        "</body></html>"
    )


def unbroken(match: re.Match) -> str:
    """A figure and its unit joined by a no-break space."""
    return f"{match.group(1)}&nbsp;{match.group(2)}"


def report_text(run: RunResult) -> str:
    """What `theinference test` prints into a log, without colours: lines whole, which the
    page wraps to its width."""
    out = Console(file=io.StringIO(), width=UNLIMITED, soft_wrap=True, color_system=None,
                  highlight=False)
    print_run(out, run)
    return trimmed(out.file.getvalue())


def stage_section(stage: StageResult) -> str:
    status = stage.status.value
    head = (
        f'<h2 class="{status}">{html_text(stage.slug)} · {html_text(stage.title)} · '
        f"{status.upper()}</h2>"
    )
    said = [("suspected bug", stage.bug_name), ("lesson", stage.lesson or ""),
            ("first departs at", where_text(stage.where)), ("hint", stage.hint)]
    terms = "".join(f"<dt>{k}</dt><dd>{html_text(v)}</dd>" for k, v in said if v)
    shown = map_case(stage)
    figure = "" if shown is None else map_figure(shown.name, shown.error_map)
    return f'<section id="{html_text(stage.slug)}">{head}<dl>{terms}</dl>{figure}</section>'


def map_figure(case: str, error_map: dict) -> str:
    first = where_text(error_map["first_at"])
    return (
        f'<figure class="error-map"><figcaption>case {html_text(case)}: error map, '
        f'{html_text(error_map["rows"]["name"])} down, '
        f'{html_text(error_map["columns"]["name"])} across; {FIRST} first departs at '
        f'<span class="first-at">{html_text(first)}</span></figcaption>'
        f"{map_svg(error_map)}</figure>"
    )


def map_svg(error_map: dict) -> str:
    """One rectangle per cell coloured by its level (the terminal's colours) holding the
    level's character, the first departure outlined and marked; the row axis named left of
    its labels, the column axis under the cells, a legend below."""
    cells = error_map["cells"]
    width = max(min(WIDEST, PLOT // len(cells[0])), NARROWEST)
    parts = [svg_row(r, label, line, width, error_map["first"])
             for r, (label, line) in enumerate(zip(error_map["rows"]["labels"], cells,
                                                    strict=True))]
    bottom = TOP + CELL * len(cells) + 16
    right = LABEL + width * len(cells[0])
    parts.append(svg_axes(error_map, right, bottom))
    parts.append(svg_legend(bottom + 34))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(right, LABEL + 560) + 10}" '
        f'height="{bottom + 60}" role="img">{"".join(parts)}</svg>'
    )


def svg_axes(error_map: dict, right: int, bottom: int) -> str:
    """The column axis's first and last labels and its name; the row axis's name, upright."""
    columns, rows = error_map["columns"], error_map["rows"]
    middle = TOP + CELL * len(error_map["cells"]) / 2
    return (
        f'<text x="{LABEL}" y="{bottom}">{html_text(columns["labels"][0].split("–")[0])}</text>'
        f'<text x="{right}" y="{bottom}" text-anchor="end">'
        f'{html_text(columns["labels"][-1].split("–")[-1])}</text>'
        f'<text class="axis" x="{(LABEL + right) / 2}" y="{bottom + 16}" text-anchor="middle" '
        f'font-weight="bold">{html_text(columns["name"])} →</text>'
        f'<text class="axis" x="{AXIS}" y="{middle}" text-anchor="middle" font-weight="bold" '
        f'transform="rotate(-90 {AXIS} {middle})">← {html_text(rows["name"])}</text>'
    )


def svg_row(r: int, label: str, line: list, width: int, first: list) -> str:
    y = TOP + r * CELL
    parts = [f'<text x="{LABEL - 6}" y="{y + CELL - 6}" text-anchor="end">'
             f"{html_text(label)}</text>"]
    for c, tolerances in enumerate(line):
        x = LABEL + c * width
        mark = [r, c] == first
        outline = ' class="first" stroke="#000" stroke-width="3"' if mark else ""
        parts.append(
            f'<rect x="{x}" y="{y}" width="{width}" height="{CELL}" '
            f'fill="{COLOURS[level(tolerances)]}"{outline}>'
            f"<title>{tolerances:.3g} tolerances</title></rect>"
            + svg_mark(x + width / 2, y, level(tolerances), FIRST if mark else "")
        )
    return "".join(parts)


def svg_mark(x: float, y: int, step: int, char: str = "") -> str:
    """The level's character (or X) inside a cell, in the ink legible on its colour."""
    return (f'<text x="{x}" y="{y + CELL - 6}" text-anchor="middle" fill="{INK[step]}" '
            f'font-weight="bold">{html_text(char or RAMP[step])}</text>')


def svg_legend(y: int) -> str:
    parts = [f'<text x="0" y="{y + 15}">worst error in tolerances:</text>']
    for step, words in enumerate(LEGEND):
        x = 200 + step * 62
        parts.append(
            f'<rect x="{x}" y="{y}" width="20" height="{CELL}" fill="{COLOURS[step]}"/>'
            + svg_mark(x + 10, y, step)
            + f'<text x="{x + 24}" y="{y + 15}">{html_text(words)}</text>'
        )
    return "".join(parts)
