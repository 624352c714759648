"""A grid of cells over points of three values (a row's first three, at unit length): the
candidates a row is compared with are the targets in the cells near it (row_index.py)."""

import itertools

import numpy as np


class Grid:
    """Points (three values each) hashed on a grid of `cell`: a query within half a cell of a
    point, in every value, is in one of the 8 cells around the query's corner nearest it."""

    def __init__(self, points, cell: float):
        self.cell = cell
        cells = cell_ids(np.floor(points / cell))
        self.order = np.argsort(cells, kind="stable")
        self.cells = cells[self.order]

    def around(self, queries, own: bool = False):
        """Each query's cell ids [Q], cell after cell of the 8 near it (its own alone, with
        `own`): its own, and those across the faces of the corner nearest it."""
        scaled = queries / self.cell
        base = np.floor(scaled)
        toward = np.where(scaled - base < 0.5, -1.0, 1.0)  # the nearer neighbour, per value
        for step in [(0.0, 0.0, 0.0)] if own else itertools.product((0.0, 1.0), repeat=3):
            yield cell_ids(base + toward * np.array(step, dtype=base.dtype))

    def crowds(self, queries) -> np.ndarray:
        """[Q]: how many points the 8 cells near each query hold."""
        count = np.zeros(len(queries), dtype=np.int64)
        for ids in self.around(queries):
            lo, hi = self.spans(ids)
            count += hi - lo
        return count

    def pairs(self, queries, numbers, own: bool = False):
        """(query number, point index) for every point in the 8 cells near each query (in
        its own cell alone, with `own`)."""
        rows_out, points_out = [], []
        for ids in self.around(queries, own):
            lo, hi = self.spans(ids)
            counts = hi - lo
            hit = np.flatnonzero(counts)
            if hit.size == 0:
                continue
            counts = counts[hit]
            starts = np.repeat(lo[hit] - np.cumsum(counts) + counts, counts)
            rows_out.append(np.repeat(numbers[hit], counts))
            points_out.append(self.order[np.arange(counts.sum()) + starts])
        if not rows_out:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(rows_out), np.concatenate(points_out)

    def margin(self, queries):
        """How near each query ([Q, 3]) lies to a face of its own cell, in its values' units,
        less what rounding the cells' float32 division may move a value by (16 of its ulps)."""
        scaled = queries / self.cell
        inside = scaled - np.floor(scaled)
        slack = np.abs(scaled).max(axis=1, initial=1.0) * 2.0**-20
        return (np.minimum(inside, 1 - inside).min(axis=1, initial=1.0) - slack) * self.cell

    def spans(self, ids):
        """Where each id's points start and end in the sorted cells (needles sorted first:
        a search for sorted needles stays in the cache)."""
        order = np.argsort(ids, kind="stable")
        lo, hi = np.empty_like(ids), np.empty_like(ids)
        lo[order] = np.searchsorted(self.cells, ids[order], side="left")
        hi[order] = np.searchsorted(self.cells, ids[order], side="right")
        return lo, hi


def cell_ids(q):
    """One integer per grid cell of three values (each cell index within +-2**20)."""
    q = np.clip(q, -(1 << 20), (1 << 20) - 1).astype(np.int64) + (1 << 20)
    return (q[:, 0] << 42) | (q[:, 1] << 21) | q[:, 2]
