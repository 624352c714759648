"""The rows of a cache guessed from its layout, then checked: a shortcut of RowIndex.match that
answers exactly as the full matcher would, for the rows it answers at all.

A cache keeps its rows in some regular order (a head's positions one after another, a
position's heads, blocks of a pool): a pair of neighbouring rows matched in full (a probe)
says which target the rows after it are, one step apart, up to the next probe. A guessed row
is taken only where it lies within SURE of its guessed target and that target is lonely
(RowIndex.lonely: no other lies within LONELY of it): every other target is then farther from
the row than AMBIGUOUS times its distance, so the full matcher would give it this target and
this scale. Every other row (a guess that missed, a crowded target, float16 storage, an order
the probes do not see) is left to the full matcher.
"""

import numpy as np

from theinference.student.grid import Grid
from theinference.student.worker import protocol

AMBIGUOUS = protocol.AMBIGUITY
# targets with no other within this (max |difference| at unit length) are lonely: half the
# reach of the tight grid's 8 cells, which finds every target within FIRST_PASS, so the
# float32 rounding of its cells never matters
LONELY = protocol.FIRST_PASS / 2
# a guess nearer than this to a lonely target is the full matcher's own answer: any other
# target is then farther than LONELY - SURE > AMBIGUOUS * SURE (a float32 cache's rows lie
# about 1e-6 from their targets, float16 storage's about 5e-4: left to the full matcher)
SURE = LONELY / (1 + AMBIGUOUS)
STEP = 64  # rows from one probe to the next
FEWEST = 4 * STEP  # rows below which guessing saves nothing
# the cells of lonely_targets' first look, 40 LONELY wide: most targets are alone in theirs
# and far from its faces (about 80% of a 1000-token prompt's)
COARSE = 40 * LONELY


def lonely_targets(units: np.ndarray, tight: Grid) -> np.ndarray:
    """[T] bool: whether no other target lies within LONELY of each (units [T, hd]). First
    on a coarse grid: alone in its cell, and farther than LONELY from its faces in each of
    the first three values (anything within LONELY is in that cell); the rest, by the tight
    grid's 8 cells near it (`tight`: cells of 2 FIRST_PASS, which hold every target within
    FIRST_PASS), alone there."""
    points = units[:, :3]  # [T, 3]
    coarse = Grid(points, COARSE)
    sorted_cells = coarse.cells
    alone_sorted = np.ones(len(sorted_cells), dtype=bool)
    same = sorted_cells[1:] == sorted_cells[:-1]
    alone_sorted[1:] &= ~same
    alone_sorted[:-1] &= ~same
    alone = np.empty_like(alone_sorted)
    alone[coarse.order] = alone_sorted
    lonely = alone & (coarse.margin(points) > LONELY)
    rest = np.flatnonzero(~lonely)
    lonely[rest] = tight.crowds(points[rest]) == 1  # itself alone
    return lonely


def guessed(index, rows: np.ndarray, match) -> tuple | None:
    """(row numbers, targets, scales) of the rows [R, hd] (float32) guessed and checked, or
    None. `match(rows)`: the full matcher, for the probes."""
    total = len(rows)
    if total < FEWEST:
        return None
    probes = np.arange(0, total - 1, STEP)  # [P]: each probe is a row and the next
    found = match(rows[np.concatenate([probes, probes + 1])])
    if found is None:
        return None
    target_of = np.full(2 * len(probes), -1, dtype=np.int64)
    target_of[found[0]] = found[1]
    first, second = target_of[: len(probes)], target_of[len(probes) :]
    known = np.append((first >= 0) & (second >= 0), False)  # [P + 1]: past the last, none
    if not layout_holds(index, rows, probes, first, second, known):
        return None
    before = np.minimum(np.arange(total) // STEP, len(probes) - 1)  # [R]: each row's probe
    taken, left = [], np.arange(total)
    for anchors in (before, before + 1):  # the probe before each row, then (a layout's
        # boundary between them) the one after, one step a row from each
        anchor = anchors[left]
        at, anchor = left[known[anchor]], anchor[known[anchor]]
        targets = first[anchor] + (at - probes[anchor]) * (second[anchor] - first[anchor])
        sure, scales = checked(index, rows[at], targets)
        taken.append((at[sure], targets[sure], scales[sure]))
        left = np.setdiff1d(left, at[sure], assume_unique=True)
    return tuple(np.concatenate(parts) for parts in zip(*taken, strict=True))


def layout_holds(index, rows: np.ndarray, probes, first, second, known) -> bool:
    """Whether the guess holds for most rows midway between probes (a float16 cache's rows lie
    too far from their targets to take, a cache kept a position's heads after each other
    turns at every position): else guessing every row would cost more than it saves."""
    anchor = np.flatnonzero(known[:-1])
    anchor = anchor[probes[anchor] + STEP // 2 < len(rows)]
    if anchor.size == 0:
        return False
    middle = probes[anchor] + STEP // 2
    targets = first[anchor] + STEP // 2 * (second[anchor] - first[anchor])
    sure, _ = checked(index, rows[middle], targets)
    return bool(sure.mean() >= 0.5)


def checked(index, rows: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([G] bool, [G] scales): whether each row [G, hd] is surely its guessed target's (within
    SURE of it, at unit length, and the target lonely), and its scale over the target's."""
    inside = (targets >= 0) & (targets < len(index))
    targets = np.where(inside, targets, 0)
    with np.errstate(all="ignore"):
        norms = np.linalg.norm(rows, axis=1)  # [G]
        err = np.abs(rows / norms[:, None] - index.units[targets]).max(axis=1)
        sure = inside & (err < SURE) & index.lonely[targets]  # NaN, zero rows: never sure
        return sure, norms / index.norms[targets]
