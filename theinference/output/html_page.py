"""A run as one standalone HTML page (`theinference test --html FILE`): each stage's verdict
and diagnosis (suspected bug, lesson, hint), its error map as inline SVG, and the terminal
report's text. No script, no stylesheet or font fetched: the page opens anywhere, offline."""

import io

from rich.console import Console

from theinference.output.consoles import trimmed
from theinference.output.heatmap import COLOURS, FIRST, LEGEND, level, map_case
from theinference.output.report import print_run
from theinference.results import RunResult, StageResult, where_text
from theinference.results.text import html_text

CELL, LABEL, TOP = 14, 120, 8  # px: a cell's height (and widest width), the row labels' room
PLOT = 640  # px across the cells at most
REPORT_WIDTH = 100  # columns of the report's text

STYLE = """body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}
pre{background:#f4f4f4;padding:1em;overflow-x:auto;font-size:12px}
.passed{color:#2e7d32}.failed,.error,.timeout{color:#c62828}.todo{color:#a76d00}
.skipped{color:#777}dt{font-weight:bold}svg text{font:11px monospace}"""


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
        f"<h2>Report</h2><pre>{html_text(report_text(run))}</pre></body></html>"
    )


def report_text(run: RunResult) -> str:
    """What `theinference test` prints, without colours."""
    out = Console(file=io.StringIO(), width=REPORT_WIDTH, color_system=None, highlight=False)
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
    """One rectangle per cell coloured by its level (the terminal's colours), the first
    departure outlined and marked; row labels left, the column axis and a legend below."""
    cells = error_map["cells"]
    width = min(CELL, PLOT // len(cells[0]))
    parts = [svg_row(r, label, line, width, error_map["first"])
             for r, (label, line) in enumerate(zip(error_map["rows"]["labels"], cells,
                                                    strict=True))]
    bottom = TOP + CELL * len(cells) + 14
    columns = error_map["columns"]
    right = LABEL + width * len(cells[0])
    parts.append(
        f'<text x="{LABEL}" y="{bottom}">{html_text(columns["labels"][0].split("–")[0])}</text>'
        f'<text x="{right}" y="{bottom}" text-anchor="end">'
        f'{html_text(columns["labels"][-1].split("–")[-1])}</text>'
        f'<text x="{(LABEL + right) / 2}" y="{bottom + 14}" text-anchor="middle">'
        f'{html_text(columns["name"])}</text>'
    )
    parts.append(svg_legend(bottom + 32))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(right, LABEL + 520) + 10}" '
        f'height="{bottom + 44}" role="img">{"".join(parts)}</svg>'
    )


def svg_row(r: int, label: str, line: list, width: int, first: list) -> str:
    y = TOP + r * CELL
    parts = [f'<text x="{LABEL - 6}" y="{y + CELL - 3}" text-anchor="end">'
             f"{html_text(label)}</text>"]
    for c, tolerances in enumerate(line):
        x = LABEL + c * width
        mark = [r, c] == first
        outline = ' class="first" stroke="#000" stroke-width="2"' if mark else ""
        parts.append(
            f'<rect x="{x}" y="{y}" width="{width}" height="{CELL}" '
            f'fill="{COLOURS[level(tolerances)]}"{outline}>'
            f"<title>{tolerances:.3g} tolerances</title></rect>"
        )
        if mark:
            parts.append(f'<text x="{x + width / 2}" y="{y + CELL - 3}" text-anchor="middle" '
                         f'fill="#fff">{FIRST}</text>')
    return "".join(parts)


def svg_legend(y: int) -> str:
    parts = [f'<text x="0" y="{y + 10}">worst error in tolerances:</text>']
    for step, words in enumerate(LEGEND):
        x = 190 + step * 60
        parts.append(
            f'<rect x="{x}" y="{y}" width="12" height="12" fill="{COLOURS[step]}"/>'
            f'<text x="{x + 16}" y="{y + 10}">{html_text(words)}</text>'
        )
    return "".join(parts)

