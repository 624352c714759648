"""The swap's search, in the grader: the arrays the student's process holds at a moment after
its prefill (sent whole by worker/swap.py, each in its own dtype) are read as rows of 64 values
(worker/cache_rows.py) and matched by direction with the prompt's K/V, which never leave the
grader; when every row of every layer's K and V is found, the answer names the rows to write and
their new values, each in its place's own scale (keys kept pre-scaled included).

Fused K|V, paged pools, arenas, one array per token or per head, interleaved heads, transposed
keys, read-only arrays and linked nodes are all rows: a row is 64 consecutive values along any
axis whose length is a multiple of 64.
"""

import numpy as np

from theinference.oracle.gpt2 import LayerKV
from theinference.student.worker.cache_rows import RowIndex, row_views

SMALL = 1 << 16  # arrays up to this size are matched together with those of their shape


class Search:
    """The prompt's K/V to find (`finds`) and what to write over them (`writes`), per layer
    ([h, n, hd] each); the rows' index is built at the first search."""

    def __init__(self, finds: list[LayerKV], writes: list[LayerKV]):
        self.layers, self.hd = len(finds), finds[0].k.shape[-1]
        self.finds = np.stack([getattr(layer, kv) for layer in finds for kv in "kv"])
        self.writes = np.stack([getattr(layer, kv) for layer in writes for kv in "kv"])
        self._index = None  # [2L, h, n, hd] each, above

    @property
    def index(self) -> RowIndex:
        if self._index is None:
            self._index = RowIndex(self.finds.reshape(-1, self.hd))
        return self._index

    def answer(self, held: list, about: str) -> tuple[dict, list[bytes]]:
        """The grader's answer to what the student's process holds (`held`: Sources, as
        worker/cache_walk.py reads them): every place to write, or why not, and which large
        arrays held no row (not sent again while unchanged)."""
        index, hd = self.index, self.hd
        places, covered = [], np.zeros(len(index), dtype=bool)
        for group in alike(held):
            for place in locate(held, group, index, hd):
                places.append(place)
                covered[place[3]] = True
        barren = sorted(set(range(len(held))) - {place[0] for place in places})
        if not covered.all():
            rows = covered.reshape(2 * self.layers, -1)
            return {"write": None, "reason": missing_reason(rows, about, hd), "barren": barren}, []
        flat = self.writes.reshape(-1, hd)  # [2L * h * n, hd]
        writes, blobs = [], []
        for at, view, rows, found, scale in places:
            values = (scale[:, None] * flat[found]).astype(np.float32)  # [rows, hd]
            writes.append({"held": at, "view": view, "rows": len(blobs), "values": len(blobs) + 1})
            blobs += [rows.astype(np.int64).tobytes(), values.tobytes()]
        return {"write": writes, "barren": barren}, blobs


def alike(held: list) -> list[list[int]]:
    """The held arrays' numbers in groups matched at once: small arrays of one shape and dtype
    together (a thousand per-token rows are one search, not a thousand), every other alone."""
    groups: dict = {}
    for i, source in enumerate(held):
        a = source.array
        key = (a.shape, a.dtype.str, source.bf16) if a.size <= SMALL else i
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def locate(held: list, group: list[int], index: RowIndex, hd: int) -> list:
    """(held number, row view number, row numbers, targets, scales) for every row of the group's
    arrays that is a target's, along the axes row_views reads (one of exactly 64 found: no
    other)."""
    places = []
    views = [row_views(held[i].array, hd) for i in group]  # alike: the same axes each
    for j, (_, exact) in enumerate(views[0]):
        rows = [member_views[j][0] for member_views in views]
        per = int(np.prod(rows[0].shape[:-1]))
        decoded = [held[i].decode(r).reshape(-1, hd) for i, r in zip(group, rows, strict=True)]
        found = index.match(np.concatenate(decoded))
        if found is None:
            continue
        member, at = np.divmod(found[0], per)
        order = np.argsort(member, kind="stable")  # each member's rows together
        members, starts = np.unique(member[order], return_index=True)
        for m, part in zip(members, np.split(order, starts[1:]), strict=True):
            places.append((group[m], j, at[part], found[1][part], found[2][part]))
        if exact:
            break  # rows along an axis of exactly 64: the other axes hold none
    return places


def missing_reason(covered: np.ndarray, about: str, hd: int) -> str:
    """Which layer's K or V is missing first, how much of it was found, and what was seen."""
    tensors = len(covered)
    missing = [t for t in range(tensors) if not covered[t].all()]
    layer, kind = divmod(missing[0], 2)
    rows = covered[missing[0]]
    return (
        f"layer {layer}'s {'KV'[kind]} ({len(missing)} of {tensors} K/V tensors incomplete; "
        f"{int(rows.sum())} of {rows.size} of its rows of {hd} values, one per head and "
        f"position, found) was not found among {about}"
    )
