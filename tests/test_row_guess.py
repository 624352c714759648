"""The search's shortcut (student/row_guess.py): rows guessed from their layout answer exactly
as the full matcher (RowIndex._match) answers them, in every layout, and most rows of a cache
kept in a regular order are guessed (the search a student's process waits on at the moment
after its prefill: 0.47 s -> 0.17 s for a 960-token prompt's 24 arrays)."""

import numpy as np
import pytest

from theinference.student import row_guess, row_index

HD, HEADS, N = 64, 12, 300
rng = np.random.default_rng(7)


def unit(a):
    return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)


def targets_of(layers: int = 4) -> np.ndarray:
    """[layers * 2 * HEADS * N, HD]: the K/V rows a search looks for, in parts_of's order."""
    return rng.standard_normal((layers * 2 * HEADS * N, HD)).astype(np.float32)


def near(rows: np.ndarray, relative: float) -> np.ndarray:
    """The rows as a student's own arithmetic gives them: off by `relative` in each value."""
    return (rows * (1 + rng.uniform(-relative, relative, rows.shape))).astype(np.float32)


def by_row(found) -> tuple:
    if found is None:
        return (np.zeros(0, np.int64),) * 3
    order = np.argsort(found[0], kind="stable")
    return tuple(np.asarray(part)[order] for part in found)


def full_only(index: row_index.RowIndex, rows: np.ndarray, monkeypatch) -> tuple:
    with monkeypatch.context() as patched:
        patched.setattr(row_guess, "guessed", lambda *args: None)
        return by_row(index.match(rows))


def layouts(targets: np.ndarray) -> dict[str, np.ndarray]:
    """The same K/V kept as caches keep them, each read as rows of HD values."""
    parts = targets.reshape(-1, HEADS, N, HD)  # [2L, h, n, hd]
    padded = np.zeros((parts.shape[0], HEADS, N + 40, HD), np.float32)
    padded[:, :, :N] = parts
    float16 = parts.astype(np.float16).astype(np.float32)
    return {
        "heads then positions": near(parts, 1e-6),
        "preallocated, zeros after": near(padded, 1e-6),
        "positions then heads": near(parts.transpose(0, 2, 1, 3), 1e-6),
        "rows in no order": near(parts.reshape(-1, HD)[rng.permutation(len(targets))], 1e-6),
        "keys kept pre-scaled": near(parts, 1e-6) * np.float32(0.125),
        "float16 storage": float16,
        "off by more than a guess takes": near(parts, 3e-4),
    }


@pytest.mark.parametrize("name", list(layouts(targets_of(1))))
def test_a_guessed_row_is_the_full_matchers_answer_in_every_layout(name, monkeypatch):
    """Catches a guess taken where the full matcher answers otherwise (another target, another
    scale, or no match): a swap written into the wrong row of a correct cache fails it."""
    targets = targets_of()
    index = row_index.RowIndex(targets)
    rows = layouts(targets)[name].reshape(-1, HD)
    with_guess = by_row(index.match(rows))
    for mine, theirs in zip(with_guess, full_only(index, rows, monkeypatch), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_guess_is_never_taken_for_a_target_another_lies_near(monkeypatch):
    """Catches a guess that trusts its layout where two targets lie within the matcher's
    reach of each other (a repeated K/V row, a pair nearer than AMBIGUOUS tells apart): the
    full matcher leaves such rows unwritten, or takes the nearer, and so must the search."""
    targets = unit(targets_of(1))
    twins = np.arange(0, len(targets) - 13, 13)
    targets[twins + 1] = targets[twins]  # exact repeats
    targets[twins + 3] = targets[twins + 2] * (1 + 3e-5)  # within LONELY of each other
    targets[twins + 5] = targets[twins + 4]
    targets[twins + 5, 0] += 5e-4  # apart by more than the tight grid's 8 cells reach
    targets[twins + 7] = targets[twins + 6]
    targets[twins + 7, 0] += 3.5e-4  # so too, by less than 4 (AMBIGUOUS) + 1 times SURE
    cell = 2 * row_index.PASSES[0]  # the tight grid's
    targets[twins + 8, 0] = 0.8 * cell  # 0.8 into its cell: the 8 near it look upward
    targets[twins + 9] = targets[twins + 8]
    targets[twins + 9, 0] -= 1.75e-4  # across the face below, out of their reach
    targets[twins + 10, 0] = row_guess.COARSE - 1e-5  # just below a coarse cell's face
    targets[twins + 11] = targets[twins + 10]
    targets[twins + 11, 0] += 2e-5  # just above it: alone in its cell, yet 2e-5 away
    index = row_index.RowIndex(targets)
    assert not index.lonely[twins].any() and not index.lonely[twins + 3].any()
    assert not index.lonely[twins + 10].any() and not index.lonely[twins + 11].any()
    assert index.lonely[twins + 4].all() and index.lonely[twins + 6].all()
    assert index.lonely[twins + 8].all(), "the reach of LONELY's proof moved"
    rows = near(targets, 1e-6)
    rows[twins + 2] = targets[twins + 3]  # exactly the twin's: the guess would say + 2
    rows[twins + 4, 0] += 2e-4  # 2e-4 from its target, 3e-4 from the next: ambiguous
    rows[twins + 6, 0] += 7.5e-5  # 7.5e-5 from its target, 2.75e-4 from the next: so too
    rows[twins + 8, 0] -= 7.9e-5  # 7.9e-5 from its target, 9.6e-5 from the next: so too
    with_guess = by_row(index.match(rows))
    for mine, theirs in zip(with_guess, full_only(index, rows, monkeypatch), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_most_rows_of_a_regular_cache_are_guessed_not_searched(monkeypatch):
    """Catches the shortcut never taken (every row compared with the targets of its grid
    cells again: the student's process waits on the whole search at the moment after its
    prefill), for caches kept in a regular order, and a lonely test that calls crowded what
    the targets' spread keeps apart."""
    targets = targets_of()
    index = row_index.RowIndex(targets)
    assert index.lonely.mean() > 0.99
    searched: list[int] = []
    full = index._match
    written = lambda rows: int(np.count_nonzero(np.abs(rows).sum(axis=1)))  # noqa: E731
    monkeypatch.setattr(index, "_match", lambda rows, *a: searched.append(written(rows))
                        or full(rows, *a))  # (zero rows: dropped at once by their norm)
    for name in ("heads then positions", "preallocated, zeros after"):
        searched.clear()
        rows = layouts(targets)[name].reshape(-1, HD)
        found = index.match(rows)
        assert len(found[0]) == len(targets), name
        assert sum(searched) < len(rows) / 10, (name, sum(searched), len(rows))


def test_a_layout_no_guess_holds_for_is_not_guessed_row_by_row(monkeypatch):
    """Catches every row of a cache the guess cannot take (float16 storage: its rows lie too
    far from their targets; a position's heads one after another: the layout turns at every
    position) checked against a guessed target before the full matcher takes them all: work
    that only costs (float16 arrays' search 0.90 -> 1.18 s for a 1023-token prompt)."""
    targets = targets_of()
    index = row_index.RowIndex(targets)
    checked_rows: list[int] = []
    real = row_guess.checked
    monkeypatch.setattr(row_guess, "checked", lambda index, rows, targets: checked_rows.append(
        len(rows)) or real(index, rows, targets))
    for name in ("float16 storage", "positions then heads"):
        checked_rows.clear()
        rows = layouts(targets)[name].reshape(-1, HD)
        index.match(rows)
        assert sum(checked_rows) < len(rows) / 10, (name, sum(checked_rows), len(rows))
