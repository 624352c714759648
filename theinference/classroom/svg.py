"""Small inline SVG charts for the class report: no library, no script, nothing fetched."""

import math
from html import escape

WIDTH, ROW, LABEL = 640, 24, 190


def bar_chart(rows: list[tuple[str, float]], percent: bool = False) -> str:
    """Horizontal bars, one per (label, value in 0..1)."""
    height = ROW * len(rows) + 10
    span = WIDTH - LABEL - 60
    bars = []
    for i, (label, value) in enumerate(rows):
        y = 5 + i * ROW
        text = f"{value * 100:.0f}%" if percent else f"{value:g}"
        bars.append(
            f'<text x="{LABEL - 6}" y="{y + 15}" text-anchor="end" font-size="12">'
            f"{escape(label)}</text>"
            f'<rect x="{LABEL}" y="{y + 3}" width="{max(value, 0) * span:.1f}" height="{ROW - 8}"'
            f' fill="#3b6fb6"><title>{escape(label)}: {text}</title></rect>'
            f'<text x="{LABEL + max(value, 0) * span + 6:.1f}" y="{y + 15}" font-size="12">'
            f"{text}</text>"
        )
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'role="img">{"".join(bars)}</svg>')


def histogram(
    values: list[float], axis: str, bins: int = 12, mark: float | None = None, log: bool = False
) -> str:
    """Counts of values in equal bins; `mark` draws a dashed line (e.g. the tolerance);
    `log`: the values are log10s, ticks show 10 to their power."""
    if not values:
        return "<p>No figures to show.</p>"
    low, high = min(values), max(values)
    if mark is not None:
        low, high = min(low, mark - 1), max(high, mark + 1)
    if high - low < 1e-9:
        high = low + 1
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - low) / width), bins - 1)] += 1
    return _columns(counts, low, width, axis, mark, log)


def _columns(counts: list[int], low: float, width: float, axis: str, mark, log: bool) -> str:
    height, top, plot = 220, 10, 170
    span = (WIDTH - 60) / len(counts)
    peak = max(counts)
    parts = []
    for i, count in enumerate(counts):
        h = plot * count / peak if peak else 0
        x = 40 + i * span
        parts.append(
            f'<rect x="{x:.1f}" y="{top + plot - h:.1f}" width="{span - 2:.1f}" height="{h:.1f}"'
            f' fill="#6a8fc9"><title>{low + i * width:.3g} to {low + (i + 1) * width:.3g}: '
            f"{count}</title></rect>"
        )
        if count:
            parts.append(f'<text x="{x + span / 2:.1f}" y="{top + plot - h - 3:.1f}" '
                         f'font-size="10" text-anchor="middle">{count}</text>')
    for i in range(0, len(counts) + 1, max(1, len(counts) // 4)):
        parts.append(f'<text x="{40 + i * span:.1f}" y="{top + plot + 14}" font-size="10" '
                     f'text-anchor="middle">{_tick(low + i * width, log)}</text>')
    if mark is not None:
        x = 40 + (mark - low) / width * span
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot}" '
                     'stroke="#b3261e" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{WIDTH / 2}" y="{height - 8}" font-size="12" text-anchor="middle">'
                 f"{escape(axis)}</text>")
    if not math.isfinite(low):
        return "<p>No finite figures to show.</p>"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'role="img">{"".join(parts)}</svg>')


def _tick(value: float, log: bool) -> str:
    return f"{10**value:.2g}" if log else f"{value:.3g}"
