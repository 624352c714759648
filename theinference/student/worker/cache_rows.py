"""Reading float arrays as rows of K/V, inside the student's process (part of the worker:
imports nothing of the grader): every array is read along each axis whose length is a
multiple of 64 as rows of 64 consecutive values, and each row is matched by direction (any
scale: pre-scaled keys) with the rows the grader sent, on a grid of their first values.
"""

import itertools
import sys

if __package__:
    from . import protocol
else:  # loaded by its path, as the worker loads its parts (swap.part): protocol first
    protocol = sys.modules["_theinference_worker_protocol"]

# max |difference| of two rows scaled to unit length (float16 storage passes): protocol.json's,
# which the Node worker matches by too
TOL = protocol.TOLERANCE
AMBIGUOUS = protocol.AMBIGUITY  # a row nearer than this factor to its second-best target names it
CHUNK = 1 << 16  # rows matched at a time (bounds the matcher's memory)


def row_views(a, hd: int, lead: int = 0) -> list:
    """Views [..., hd] of the array, each with its kind: along every axis whose length is a
    multiple of hd (axes of exactly hd first: "exact"), that axis moved last and split into
    runs of hd consecutive values ("runs": a merged [N, 768] row is 12 heads of 64; a fused K|V
    row 24), then into hd values a stride apart ("minor": a row kept head-minor, [64, 12]).
    The first `lead` axes are never read as rows and stay first (arrays stacked on them are
    read as each would be alone). Views only: writing one writes the array."""
    return list(each_row_view(a, hd, lead))


def each_row_view(a, hd: int, lead: int = 0):
    """row_views one at a time (the swap's writes want one)."""
    import numpy as np

    if a.ndim <= lead or a.size < hd * int(np.prod(a.shape[:lead])):
        return
    exact_first = sorted(range(lead, a.ndim), key=lambda axis: a.shape[axis] != hd)
    for axis in exact_first:
        length = a.shape[axis]
        if length % hd:
            continue
        moved = np.moveaxis(a, axis, -1)
        if length == hd:
            yield moved, "exact"
            continue
        # splitting one axis in two is always a view, whatever its stride
        yield moved.reshape(*moved.shape[:-1], length // hd, hd), "runs"
        minor = moved.reshape(*moved.shape[:-1], hd, length // hd)
        yield np.swapaxes(minor, -1, -2), "minor"


class RowIndex:
    """The rows to find, scaled to unit length and hashed on a grid of their first three
    values, so that a row is compared only with the few targets it could be (any scale: keys
    kept pre-scaled are the same direction). Two passes: a tight one that the float32 and
    float64 rows of a correct cache meet with almost no false candidates, then a loose one
    (float16 storage) for the rows left over."""

    def __init__(self, targets):
        import numpy as np

        targets = np.asarray(targets, dtype=np.float32)  # [T, hd]
        self.norms = np.linalg.norm(targets, axis=1)  # [T]
        self.units = targets / np.maximum(self.norms, 1e-30)[:, None]  # [T, hd]
        self.grids = {tol: Grid(self.units[:, :3], 2 * tol) for tol in PASSES}

    def __len__(self) -> int:
        return len(self.norms)

    def match(self, rows):
        """(row numbers, their targets, scales) for the rows [R, hd] that are a target's
        direction unambiguously (nearer by AMBIGUOUS than to any other), or None."""
        import numpy as np

        found = [self._match(rows[i : i + CHUNK], i) for i in range(0, len(rows), CHUNK)]
        found = [f for f in found if f is not None]
        if not found:
            return None
        return tuple(np.concatenate(parts) for parts in zip(*found, strict=True))

    def _match(self, rows, offset: int):
        import numpy as np

        rows = np.asarray(rows, dtype=np.float32)
        with np.errstate(all="ignore"):
            norms = np.linalg.norm(rows, axis=1)
            units = rows / norms[:, None]
        left = np.flatnonzero(np.isfinite(norms) & (norms > 0))
        got_rows, got_targets = [], []
        for tol in PASSES:
            if left.size == 0:
                break
            at, targets = self.nearest(units, left, tol)
            got_rows.append(at)
            got_targets.append(targets)
            left = np.setdiff1d(left, at, assume_unique=True)
        if not got_rows or sum(r.size for r in got_rows) == 0:
            return None
        rows_at, targets = np.concatenate(got_rows), np.concatenate(got_targets)
        return rows_at + offset, targets, norms[rows_at] / self.norms[targets]

    def nearest(self, units, live, tol: float):
        """(rows, targets): each of the rows `live` within `tol` of a target, with it. The
        targets in a row's own cell first: a row whose best there, and any target as near as
        AMBIGUOUS times it, lies nearer than the cell's faces has no other candidate that
        could change its answer (every value of a row within e of the query is within e of
        it); only the rest are compared with the 8 cells around them."""
        import numpy as np

        grid = self.grids[tol]
        rows, targets = grid.pairs(units[live, :3], live, own=True)
        rows, targets, err = self.clear(units, rows, targets, tol)
        sure = AMBIGUOUS * np.maximum(err, 1e-7) < grid.margin(units[rows, :3])
        rest = np.setdiff1d(live, rows[sure], assume_unique=True)
        more, more_targets, _ = self.clear(units, *grid.pairs(units[rest, :3], rest), tol)
        rows, targets = np.concatenate([rows[sure], more]), np.concatenate([targets[sure],
                                                                            more_targets])
        order = np.argsort(rows, kind="stable")
        return rows[order], targets[order]

    def clear(self, units, rows, targets, tol: float):
        """(rows, targets, errors) of the candidate pairs: each row's best target within
        `tol`, where it is nearer by AMBIGUOUS than the row's runner-up among them."""
        import numpy as np

        err = np.abs(units[rows] - self.units[targets]).max(axis=1) if rows.size else rows
        near = err <= tol
        rows, targets, err = rows[near], targets[near], err[near].astype(np.float32)
        if rows.size == 0:
            return rows, targets, err
        order = np.lexsort((err, rows))  # per row, best first
        rows, targets, err = rows[order], targets[order], err[order]
        first = np.r_[True, rows[1:] != rows[:-1]]
        runner_up = np.full(rows.size, np.inf)
        runner_up[:-1] = np.where(~first[1:], err[1:], np.inf)
        clear = first & (runner_up > AMBIGUOUS * np.maximum(err, 1e-7))
        return rows[clear], targets[clear], err[clear]


PASSES = (protocol.FIRST_PASS, TOL)  # the tight pass, then the loose one for the rows it left


class Grid:
    """Points (three values each) hashed on a grid of `cell`: a query within half a cell of a
    point, in every value, is in one of the 8 cells around the query's corner nearest it."""

    def __init__(self, points, cell: float):
        import numpy as np

        self.cell = cell
        cells = cell_ids(np.floor(points / cell))
        self.order = np.argsort(cells, kind="stable")
        self.cells = cells[self.order]

    def pairs(self, queries, numbers, own: bool = False):
        """(query number, point index) for every point in the 8 cells near each query (in
        its own cell alone, with `own`)."""
        import numpy as np

        scaled = queries / self.cell
        base = np.floor(scaled)
        toward = np.where(scaled - base < 0.5, -1.0, 1.0)  # the nearer neighbour, per value
        rows_out, points_out = [], []
        for step in [(0.0, 0.0, 0.0)] if own else itertools.product((0.0, 1.0), repeat=3):
            ids = cell_ids(base + toward * np.array(step, dtype=base.dtype))
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
        import numpy as np

        scaled = queries / self.cell
        inside = scaled - np.floor(scaled)
        slack = np.abs(scaled).max(axis=1, initial=1.0) * 2.0**-20
        return (np.minimum(inside, 1 - inside).min(axis=1, initial=1.0) - slack) * self.cell

    def spans(self, ids):
        """Where each id's points start and end in the sorted cells (needles sorted first:
        a search for sorted needles stays in the cache)."""
        import numpy as np

        order = np.argsort(ids, kind="stable")
        lo, hi = np.empty_like(ids), np.empty_like(ids)
        lo[order] = np.searchsorted(self.cells, ids[order], side="left")
        hi[order] = np.searchsorted(self.cells, ids[order], side="right")
        return lo, hi


def cell_ids(q):
    """One integer per grid cell of three values (each cell index within +-2**20)."""
    import numpy as np

    q = np.clip(q, -(1 << 20), (1 << 20) - 1).astype(np.int64) + (1 << 20)
    return (q[:, 0] << 42) | (q[:, 1] << 21) | q[:, 2]
