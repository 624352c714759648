"""The grader's matcher of rows (inside the grader: the K/V it matches never leave it): the rows
an array is read as (student/worker/cache_rows.py) are matched by direction (any scale: keys
kept pre-scaled) with the prompt's K/V rows, on a grid of their first values, after a sieve
that drops, at a few operations a row, the rows no target lies near (most of an array that
is no cache: attention scores, activations).
"""

import numpy as np

from theinference.student import row_guess
from theinference.student.grid import Grid
from theinference.student.worker import protocol

# max |difference| of two rows scaled to unit length (float16 storage passes): protocol.json's
TOL = protocol.TOLERANCE
AMBIGUOUS = protocol.AMBIGUITY  # a row nearer than this factor to its second-best target names it
CHUNK = 1 << 16  # rows matched at a time (bounds the matcher's memory)


class RowIndex:
    """The rows to find, scaled to unit length and hashed on a grid of their first three
    values, so that a row is compared only with the few targets it could be (any scale: keys
    kept pre-scaled are the same direction). Two passes: a tight one that the float32 and
    float64 rows of a correct cache meet with almost no false candidates, then a loose one
    (float16 storage) for the rows left over."""

    def __init__(self, targets, owned: bool = False):
        targets = np.asarray(targets, dtype=np.float32)  # [T, hd]
        self.norms = np.linalg.norm(targets, axis=1)  # [T]
        scale = np.maximum(self.norms, 1e-30)[:, None]
        # [T, hd]: in the targets' own memory where the caller gave them up (`owned`)
        self.units = np.divide(targets, scale, out=targets if owned else None)
        self.grids = {tol: Grid(self.units[:, :3], 2 * tol) for tol in PASSES}
        self._sieve: Sieve | None = None  # built once it pays: SIEVE_AFTER
        self._lonely: np.ndarray | None = None
        self.matched = 0  # rows matched so far

    def __len__(self) -> int:
        return len(self.norms)

    @property
    def sieve(self) -> "Sieve":
        """The loose pass's sieve (the tight pass's rows pass it too)."""
        if self._sieve is None:
            self._sieve = Sieve(self.units, TOL)
        return self._sieve

    @property
    def lonely(self) -> np.ndarray:
        """[T] bool: the targets no other lies within row_guess.LONELY of, whose guessed rows
        row_guess may take."""
        if self._lonely is None:
            self._lonely = row_guess.lonely_targets(self.units, self.grids[protocol.FIRST_PASS])
        return self._lonely

    def match(self, rows):
        """(row numbers, their targets, scales) for the rows [R, hd] that are a target's
        direction unambiguously (nearer by AMBIGUOUS than to any other), or None."""
        self.matched += len(rows)
        pays = self.matched > SIEVE_AFTER * len(self) and self.units.shape[1] >= SIEVED
        sieve = self.sieve if pays else None  # (a toy model's rows may have fewer values)
        found = [self._chunk(rows[i : i + CHUNK], i, sieve) for i in range(0, len(rows), CHUNK)]
        found = [f for f in found if f is not None]
        if not found:
            return None
        return tuple(np.concatenate(parts) for parts in zip(*found, strict=True))

    def _chunk(self, rows, offset: int, sieve: "Sieve | None"):
        """_match's answer for the rows, in row order: those row_guess takes from their
        layout, without the grid, and _match's for the rest."""
        rows = np.asarray(rows, dtype=np.float32)
        guess = row_guess.guessed(self, rows, lambda probes: self._match(probes, 0, sieve))
        if guess is None or guess[0].size == 0:
            return self._match(rows, offset, sieve)
        left = np.setdiff1d(np.arange(len(rows)), guess[0], assume_unique=True)
        rest = self._match(rows[left], 0, sieve) if left.size else None
        if rest is not None:
            rest = (left[rest[0]], *rest[1:])
            guess = tuple(np.concatenate(parts) for parts in zip(guess, rest, strict=True))
        order = np.argsort(guess[0], kind="stable")
        return guess[0][order] + offset, guess[1][order], guess[2][order]

    def _match(self, rows, offset: int, sieve: "Sieve | None"):
        rows = np.asarray(rows, dtype=np.float32)
        with np.errstate(all="ignore"):
            norms = np.linalg.norm(rows, axis=1)
            sieved = np.flatnonzero(np.isfinite(norms) & (norms > 0))
            # the sieve reads a row's first values alone: only the rows it lets through are
            # scaled whole (an array that is no cache is mostly dropped here)
            if sieve is not None:
                sieved = sieved[sieve.passes(rows[sieved, :SIEVED] / norms[sieved, None])]
            units = rows[sieved] / norms[sieved, None]  # [S, hd]
        left = np.arange(len(sieved))
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
        rows_at, targets = sieved[np.concatenate(got_rows)], np.concatenate(got_targets)
        return rows_at + offset, targets, norms[rows_at] / self.norms[targets]

    def nearest(self, units, live, tol: float):
        """(rows, targets): each of the rows `live` within `tol` of a target, with it. The
        targets in a row's own cell first: a row whose best there, and any target as near as
        AMBIGUOUS times it, lies nearer than the cell's faces has no other candidate that
        could change its answer (every value of a row within e of the query is within e of
        it); only the rest are compared with the 8 cells around them."""
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


# a row looks up the cells on either side of it in its first ROW_SIDE values (2**3 lookups);
# a target is kept in the two cells nearest it in each of the next TARGET_SIDE (2**2 bits)
ROW_SIDE, TARGET_SIDE = 3, 2
SIEVED = ROW_SIDE + TARGET_SIDE
SIEVE_BITS = 28  # the targets' cells hashed into 2**28 bits (32 MB): few collide
KEY_STEPS = (1 << (9 * np.arange(SIEVED))).astype(np.int64)  # a cell's key: 9 bits a value
HASH = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier (2**64 / golden ratio)
WIDER = 1.01  # the sieve's cells a little wider than 2 tol: a float's rounding never matters
# the sieve is built once an index has matched this many times its targets' rows: its build
# (0.14 s for a 1000-token prompt) then costs less than the rows it drops would have; a search
# that meets little but the cache (most moments of most layouts) never builds it
SIEVE_AFTER = 2


class Sieve:
    """Which rows may lie within `tol` of a target: a row within tol of a target in every value
    is so in its first SIEVED values. On a grid of cells about 2 tol wide, the target's cell is
    then, in each of the first ROW_SIDE values, the row's own or its nearer neighbour (as the
    Grid finds it in three); in each of the next TARGET_SIDE, one of the two cells nearest the
    target holds the row's nearest corner. The targets' cells are kept as bits, hashed: a row
    none of whose 2**ROW_SIDE cells' bits is set lies near no target and is dropped (a
    collision only lets a row through). On five values, the cells around a row of an array
    that is no cache almost never hold a target; on three (the Grid's) they mostly do, for a
    long prompt."""

    def __init__(self, units, tol: float):
        self.cell = np.float32(2 * tol * WIDER)
        cells = np.floor(units[:, :SIEVED] / self.cell)  # [T, SIEVED]
        keys = cell_key(cells)
        for axis in range(ROW_SIDE, SIEVED):  # the next cell up too: both nearest the target
            keys = np.concatenate([keys, keys + KEY_STEPS[axis]])
        slots = slot(keys)
        self.bits = np.zeros(1 << (SIEVE_BITS - 3), dtype=np.uint8)
        np.bitwise_or.at(self.bits, slots >> np.uint64(3), bit_of(slots))

    def passes(self, units) -> np.ndarray:
        """[R] bool: whether a target's cell is among those around each row (units [R,
        >= SIEVED]: the rows' first values, each row scaled to unit length)."""
        scaled = units[:, :SIEVED] / self.cell  # [R, SIEVED]
        cells = np.floor(scaled)
        cells[:, ROW_SIDE:] = np.floor(scaled[:, ROW_SIDE:] + 0.5)  # the nearest corner
        side = scaled[:, :ROW_SIDE] - cells[:, :ROW_SIDE] < 0.5
        steps = np.where(side, -KEY_STEPS[:ROW_SIDE], KEY_STEPS[:ROW_SIDE])  # to the neighbour
        key = cell_key(cells)  # [R]
        hit = self.holds(key)
        for i in range(1, 1 << ROW_SIDE):  # the cells in Gray code order: one step each
            axis = (i & -i).bit_length() - 1
            key = key + steps[:, axis] if (i ^ (i >> 1)) >> axis & 1 else key - steps[:, axis]
            hit |= self.holds(key)
        return hit

    def holds(self, keys) -> np.ndarray:
        slots = slot(keys)
        return (self.bits[slots >> np.uint64(3)] & bit_of(slots)) != 0


def cell_key(q) -> np.ndarray:
    """One integer per cell of SIEVED values (a unit row's values are within +-1: within
    +-256 cells of 2 tol, a neighbour's included)."""
    return (np.clip(q, -255, 255).astype(np.int64) + 256) @ KEY_STEPS


def slot(keys) -> np.ndarray:
    """A key's bit in the sieve (its top SIEVE_BITS bits, multiplied by HASH mod 2**64)."""
    return (keys.view(np.uint64) * HASH) >> np.uint64(64 - SIEVE_BITS)


def bit_of(slots) -> np.ndarray:
    return np.left_shift(np.uint8(1), (slots & np.uint64(7)).astype(np.uint8))
