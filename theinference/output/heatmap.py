"""A case's error map (results/error_map.py) drawn in the terminal: one character per cell, of a
ramp by how far past the tolerance the cell lands (log scale), on a background of the level's
colour; the cell of the first departure marked X. The characters alone tell the levels apart
(a CI log has no colours); 16-colour terminals get a palette of their own, since the full one
falls onto the same few colours there."""

import math

from rich.console import Console, ConsoleOptions, RenderResult
from rich.padding import Padding
from rich.text import Text

from theinference.results import CaseResult, StageResult, where_text

# a cell's level: 0 within the tolerance, then one per decade beyond it, the last open-ended
BOUNDS = [1, 10, 100, 1_000, 10_000]
RAMP = ".:+*#@"  # plain output, one character per level
# light to dark past the tolerance, each level's lightness apart from its neighbours'
COLOURS = ["#2e7d32", "#fff176", "#ffb300", "#f4511e", "#b71c1c", "#4a148c"]
INK = ["white", "black", "black", "black", "white", "white"]  # legible on each level
COLOURS_16 = ["green", "yellow", "bright_yellow", "red", "magenta", "blue"]
INK_16 = ["white", "black", "black", "white", "white", "white"]
LEGEND = ["≤1", "≤10", "≤100", "≤1e3", "≤1e4", ">1e4"]  # each level's bound, as BOUNDS says
FIRST = "X"
LABEL_WIDTH = 14  # at most, for row labels


def level(tolerances: float) -> int:
    """0 at or below 1 tolerance, then 1 per decade beyond (1 <  x <= 10: 1), capped."""
    if tolerances <= 1:
        return 0
    if not math.isfinite(tolerances):  # drawn as far past it as can be, never as within
        return len(BOUNDS)
    return min(math.ceil(math.log10(tolerances)), len(BOUNDS))


class ErrorMapView:
    """The map within the width it is given: columns beyond it merge (each its worst), and
    neighbouring rows drawn alike share one line ("1–11"), the first departure's row apart."""

    def __init__(self, error_map: dict, case: str = ""):
        self.map, self.case = error_map, case

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        styles = palette(console)
        rows, columns = self.map["rows"], self.map["columns"]
        first_row, first_column = self.map["first"]
        widest = min(max(len(label) for label in rows["labels"]), LABEL_WIDTH)
        merge = math.ceil(len(columns["labels"]) / max(options.max_width - widest - 1, 8))
        drawn = [
            (label, tuple(level(max(cells[c : c + merge])) for c in range(0, len(cells), merge)))
            for label, cells in zip(rows["labels"], self.map["cells"], strict=True)
        ]
        lines = alike_rows_joined(drawn, first_row)
        width = min(max(len(label) for label, _, _ in lines), LABEL_WIDTH)
        title = f"error map: {rows['name']} down, {columns['name']} across"
        if self.case and len(title) + len(self.case) + 3 <= options.max_width:
            title += f" · {self.case}"  # one line where it fits
        elif self.case:
            yield Text(f"case: {self.case}", style="dim")
        yield Text(title, style="bold")
        for label, levels, first in lines:
            line = Text.assemble((label[:width].rjust(width) + " ", "dim"))
            for c, step in enumerate(levels):
                marked = first and c * merge <= first_column < (c + 1) * merge
                line.append(cell_of(step, marked, styles))
            yield line
        shown = math.ceil(len(columns["labels"]) / merge)
        yield axis_line(columns, width, shown, options.max_width)
        yield legend(styles)
        yield Text(f"{FIRST} first departs at {where_text(self.map['first_at'])}", style="bold")


def alike_rows_joined(drawn: list[tuple[str, tuple]], first_row: int) -> list[tuple]:
    """(label, levels, holds the first departure) per line: a run of neighbouring rows drawn
    alike as one, labelled "first–last"; the first departure's row stays a line of its own."""
    lines: list[list] = []
    for r, (label, levels) in enumerate(drawn):
        joins = lines and not lines[-1][2] and r != first_row and lines[-1][1] == levels
        if joins:
            lines[-1][0] = f"{lines[-1][0].split('–')[0]}–{label.split('–')[-1]}"
        else:
            lines.append([label, levels, r == first_row])
    return [tuple(line) for line in lines]


def palette(console: Console) -> list[str] | None:
    """Each level's style on this console, in colours it can tell apart, or None (no colours:
    characters only)."""
    if console.no_color or console.color_system is None:
        return None
    sixteen = console.color_system in ("standard", "windows")
    colours, inks = (COLOURS_16, INK_16) if sixteen else (COLOURS, INK)
    return [f"bold {ink} on {colour}" for colour, ink in zip(colours, inks, strict=True)]


def cell(tolerances: float, marked: bool, styles: list[str] | None) -> Text:
    return cell_of(level(tolerances), marked, styles)


def cell_of(step: int, marked: bool, styles: list[str] | None) -> Text:
    char = FIRST if marked else RAMP[step]
    return Text(char) if styles is None else Text(char, style=styles[step])


def axis_line(columns: dict, width: int, shown: int, room: int) -> Text:
    """The column axis under the grid: the first label, the last, and its name if it fits."""
    first, last = columns["labels"][0], columns["labels"][-1]
    first, last = first.split("–")[0], last.split("–")[-1]
    gap = max(shown - len(first) - len(last), 1)
    line = Text(" " * (width + 1) + first + " " * gap + last, style="dim")
    if len(line) + 2 + len(columns["name"]) <= room:
        line.append(f"  {columns['name']}", style="dim")
    return line


def legend(styles: list[str] | None) -> Text:
    """Each level's character or colour, and the error it stands for."""
    line = Text.assemble(("worst error in tolerances:", "dim"))
    for step, words in enumerate(LEGEND):
        line.append(" ")
        line.append_text(cell(BOUNDS[step - 1] * 2 if step else 0.0, False, styles))
        line.append(words, style="dim")
    return line


def map_case(stage: StageResult) -> CaseResult | None:
    """The case whose map a stage shows: the one it shows in full, else its first with one."""
    shown = [stage.case(stage.first_case), *stage.cases]
    return next((c for c in shown if c is not None and c.error_map), None)


def map_lines(stage: StageResult) -> list:
    """The stage's error map under its diagnosis (none when no case has one)."""
    if (case := map_case(stage)) is None:
        return []
    return [Padding(ErrorMapView(case.error_map, case.name), (0, 0, 0, 4), expand=False)]
