"""Where an answer departs, as a picture: a 2-D grid of error in tolerances, bounded in size.

A check that localises a failure (a cache's layer and position, a decode's step) knows which
two axes its arrays have; it hands `error_map` the error in tolerances over those axes and
gets back plain values (lists, strings, numbers) every output can draw:

    {"rows": {"name": "layer", "labels": ["0 K", ...]},     one label per cell, after merging
     "columns": {"name": "position", "labels": ["0", ...]},
     "cells": [[0.2, 31.0, ...], ...],                      [rows][columns], in tolerances
     "first": [row, column],                                the cell holding the first departure
     "first_at": {"layer": "0 K", "position": "3"}}         that departure, unmerged

"First" is first in the localisation's order: rows before columns, so a check puts the axis
it walks first (layers, steps) on the rows.
"""

import numpy as np

from theinference.results.compare import Tolerance

MAX_ROWS, MAX_COLUMNS = 12, 64  # what a terminal can show; larger grids merge cells


def in_tolerances(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> np.ndarray:
    """|actual - expected| / (atol + rtol |expected|), elementwise (compare()'s rule): above 1
    is outside the tolerance."""
    e = expected.astype(np.float64)
    return np.abs(actual.astype(np.float64) - e) / (tol.atol + tol.rtol * np.abs(e))


def error_map(
    ratio: np.ndarray, rows: tuple[str, list[str]], columns: tuple[str, list[str]]
) -> dict | None:
    """The map of `ratio` [n_rows, n_columns] (error in tolerances), its axes named and
    labelled (name, one label per row or column); None when no cell departs."""
    departing = np.argwhere(ratio > 1)  # row-major: the localisation's order
    if not departing.size:
        return None
    row_edges = bin_edges(ratio.shape[0], MAX_ROWS)
    column_edges = bin_edges(ratio.shape[1], MAX_COLUMNS)
    merged = np.maximum.reduceat(ratio, row_edges[:-1], axis=0)  # [<=12, n_columns]
    merged = np.maximum.reduceat(merged, column_edges[:-1], axis=1)  # [<=12, <=64]
    row, column = (int(i) for i in departing[0])
    return {
        "rows": merged_axis(rows, row_edges),
        "columns": merged_axis(columns, column_edges),
        "cells": [[round(float(x), 4) for x in line] for line in merged],
        "first": [bin_of(row, row_edges), bin_of(column, column_edges)],
        "first_at": {rows[0]: rows[1][row], columns[0]: columns[1][column]},
    }


def bin_edges(n: int, most: int) -> np.ndarray:
    """Edges of min(n, most) near-equal runs of 0..n: [0, ..., n]."""
    return np.linspace(0, n, min(n, most) + 1).round().astype(int)


def bin_of(index: int, edges: np.ndarray) -> int:
    return int(np.searchsorted(edges, index, side="right")) - 1


def merged_axis(axis: tuple[str, list[str]], edges: np.ndarray) -> dict:
    """The axis's name, and a label per merged run: its own, or "first–last"."""
    name, labels = axis
    runs = zip(edges[:-1], edges[1:], strict=True)
    merged = [labels[a] if b - a == 1 else f"{labels[a]}–{labels[b - 1]}" for a, b in runs]
    return {"name": name, "labels": merged}


def numbered(n: int) -> list[str]:
    return [str(i) for i in range(n)]
