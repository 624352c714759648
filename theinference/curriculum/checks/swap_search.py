"""The swap's search, in the grader: the arrays the student's process holds at a moment after
its prefill (sent whole by worker/swap.py, each in its own dtype) are read as rows of 64 values
(worker/cache_rows.py) and matched by direction with the prompt's K/V, which never leave the
grader; when every row of every layer's K and V is found, the answer names the rows the swap
changes and their new values, each in its place's own scale (keys kept pre-scaled included).

Fused K|V, paged pools, arenas, one array per token or per head, interleaved heads, transposed
keys, read-only arrays and linked nodes are all rows: a row is 64 consecutive values along any
axis whose length is a multiple of 64, or 64 values a stride apart (a position's heads kept
head-minor), its values in their order or in any one fixed order of their own.
"""

import numpy as np

from theinference.oracle.gpt2 import LayerKV
from theinference.student.reply_arrays import BadReply, Known
from theinference.student.row_index import TOL, RowIndex
from theinference.student.worker import held as held_rules
from theinference.student.worker.cache_rows import row_views

SMALL = 1 << 16  # arrays up to this size are matched together with those of their shape


class Search:
    """The prompt's K/V to find (`finds`) and what to write over them (`writes`), per layer
    ([h, n, hd] each); the rows' index is built at the first search."""

    def __init__(self, finds: list[LayerKV], writes: list[LayerKV]):
        self.layers, self.hd = len(finds), finds[0].k.shape[-1]
        # the plan's own arrays, not copies (a 1023-token prompt's K/V are 151 MB in float64,
        # and the layers the swap leaves are the same arrays in both): rows are read from them
        self.finds, self.writes = parts_of(finds), parts_of(writes)
        # [2L * h * n]: the rows the swap changes (the layers it leaves are not written back)
        self.moved = np.concatenate([np.zeros(f.shape[:2], bool).reshape(-1) if f is w else
                                     (f != w).any(axis=-1).reshape(-1)
                                     for f, w in zip(self.finds, self.writes, strict=True)])
        self._index = self._sorted = None
        self._one_signed: bool | None = None  # one_signed_barren, once known
        self.found = 0  # rows of the K/V the last answer found
        # an array's number (the worker's) -> the places found in it, where there were any: a
        # later moment names it Known while it is unchanged, and is not searched again
        self.memo: dict[int, list] = {}

    @property
    def index(self) -> RowIndex:
        if self._index is None:
            # [2L * h * n, hd], float32 from the start: the index's own copy
            targets = np.concatenate([f.reshape(-1, self.hd) for f in self.finds], dtype=np.float32)
            self._index = RowIndex(targets, owned=True)
        return self._index

    def prepare(self) -> None:
        """All the search needs before its first moment, built now (by the planner, beside the
        student's earlier calls), not while the student's process waits on the answer."""
        self.index.lonely  # noqa: B018
        self.one_signed_barren  # noqa: B018

    @property
    def sorted_index(self) -> RowIndex:
        """The rows to find with each row's values sorted: what a row kept in a shuffled order
        of its 64 values still matches (fixed_order)."""
        if self._sorted is None:
            self._sorted = RowIndex(np.sort(self.index.units, axis=1), owned=True)
        return self._sorted

    def answer(self, held: list, about: str) -> tuple[dict, list[bytes]]:
        """The grader's answer to what the student's process holds (`held`: arrays Sent, as
        worker/cache_walk.py reads them, or Known by their number): every place to write, or
        why not, and which arrays held no row (not sent again while unchanged)."""
        hd = self.hd
        places, covered = self.recalled(held), np.zeros(len(self.index), dtype=bool)
        sent = [i for i, source in enumerate(held) if not isinstance(source, Known)]
        signs = self.one_signed_barren
        for group in alike(held, [i for i in sent if not (signs and one_signed(held[i]))]):
            places += locate(held, group, self, reorder=False)
        for place in places:
            covered[place[3]] = True
        if not covered.all():  # rows kept in an order of their own, in each array left
            used = {place[0] for place in places}
            for i in (i for i in sent if i not in used):
                for place in locate(held, [i], self, reorder=True):
                    places.append(place)
                    covered[place[3]] = True
        self.remember(held, sent, places)
        barren = sorted(set(sent) - {place[0] for place in places})
        self.found = int(covered.sum())
        if not covered.all():
            rows = covered.reshape(2 * self.layers, -1)
            return {"write": None, "reason": missing_reason(rows, about, hd), "barren": barren,
                    "one_signed": signs}, []
        writes, blobs = [], []
        for at, view, rows, found, scale, order in places:
            moved = self.moved[found]
            if not moved.any():
                continue  # a place of layers the swap leaves as they are
            rows, found, scale = rows[moved], found[moved], scale[moved]
            values = (scale[:, None] * rows_of(self.writes, found)).astype(np.float32)  # [rows, hd]
            if order is not None:  # kept in a fixed order of its own: written in it
                values = values[:, order]
            writes.append({"held": at, "view": view, "rows": len(blobs), "values": len(blobs) + 1})
            blobs += [rows.astype(np.int64).tobytes(), values.tobytes()]
        return {"write": writes, "barren": barren}, blobs

    @property
    def one_signed_barren(self) -> bool:
        """Whether an array all of whose values are >= 0, or all <= 0, holds no row: every
        target, at unit length, has a value below -TOL and one above TOL, which no row of one
        sign (in any order, at any positive scale) comes within TOL of. Attention
        probabilities are such arrays: [heads, n, n], the largest a prefill makes."""
        if self._one_signed is None:
            units = self.index.units  # [T, hd]
            self._one_signed = bool((units.min(axis=1) < -TOL).all()
                                    and (units.max(axis=1) > TOL).all())
        return self._one_signed

    def recalled(self, held: list) -> list:
        """The places found at earlier moments in the arrays named Known now."""
        places = []
        for i, source in enumerate(held):
            if isinstance(source, Known):
                if source.number not in self.memo:
                    raise BadReply(f"array {source.number} was never searched with rows in it")
                places += [(i, *place) for place in self.memo[source.number]]
        return places

    def remember(self, held: list, sent: list[int], places: list) -> None:
        """Each numbered array's places, where it had any (the worker names it Known after)."""
        mine: dict = {}
        for place in places:
            mine.setdefault(place[0], []).append(place[1:])
        for i in sent:
            number = held[i].number  # (the Node worker gives none)
            if number is not None and i in mine:
                self.memo[number] = mine[i]


def parts_of(layers: list[LayerKV]) -> list[np.ndarray]:
    """Each layer's K then V ([h, n, hd] each), in the order their rows are numbered: row r of
    part p is target p * h * n + r."""
    return [getattr(layer, kv) for layer in layers for kv in "kv"]


def rows_of(parts: list[np.ndarray], numbers: np.ndarray) -> np.ndarray:
    """[len(numbers), hd]: the rows so numbered (parts_of's numbering), read in place."""
    h, n, hd = parts[0].shape
    part, within = np.divmod(numbers, h * n)
    out = np.empty((len(numbers), hd), dtype=np.result_type(*parts))
    for p in np.unique(part):
        here = part == p
        out[here] = parts[p][within[here] // n, within[here] % n]
    return out


def one_signed(source) -> bool:
    """Whether an array of floats sent holds values of one sign alone (>= 0, or <= 0; NaN
    neither): held.one_signed's, read here too, where a worker does not skip them."""
    return not source.bf16 and held_rules.one_signed(source.array)


def alike(held: list, sent: list[int]) -> list[list[int]]:
    """The sent arrays' numbers in groups matched at once: small arrays of one shape and dtype
    together (a thousand per-token rows are one search, not a thousand), every other alone."""
    groups: dict = {}
    for i in sent:
        source = held[i]
        a = source.array
        key = (a.shape, a.dtype.str, source.bf16) if a.size <= SMALL else i
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def locate(held: list, group: list[int], search: Search, reorder: bool) -> list:
    """(held number, row view number, row numbers, targets, scales, order) for every row of the
    group's arrays that is a target's, along the views row_views reads (those along the
    array's last axis first, where most caches keep their rows): none past an axis of exactly
    64 that held rows, nor an axis read head-minor whose runs of 64 held rows, nor, in an
    array alone, past a view whose rows found hold every value of the array that is not zero
    (no other row of 64 values there is a K/V row: it would share values with one found, or
    hold a zero). A view none of whose rows is a target's is tried, with `reorder`, in a fixed
    order of each row's values (`order`: a row's value j is the target's value order[j]),
    where there is one."""
    hd, places = search.hd, []
    first = held[group[0]]  # alike: the same shape, dtype and reading, read as one
    stacked = first.array[None] if len(group) == 1 else np.stack([held[i].array for i in group])
    views = list(enumerate(row_views(stacked, hd, lead=1)))  # (j, (view [G, ..., hd], ...))
    last = stacked.ndim - 1
    views.sort(key=lambda v: (v[1][1] != "exact", v[1][2] != last))  # stable: else in order
    runs_found: set[int] = set()  # the axes whose runs held rows
    for j, (view, kind, axis) in views:
        if kind == "minor" and axis in runs_found:
            continue
        per = int(np.prod(view.shape[1:-1]))  # rows of each member
        decoded = first.decode(view).reshape(-1, hd)  # [G * per, hd]
        found, order = None, None
        if not reorder:
            found = search.index.match(decoded)
        elif kind != "minor":  # the first pass found none of these rows in their own order
            order = fixed_order(decoded, search)
            found = None if order is None else search.index.match(decoded[:, np.argsort(order)])
        if found is None:
            continue
        runs_found |= {axis} if kind == "runs" else set()
        member, at = np.divmod(found[0], per)
        sort = np.argsort(member, kind="stable")  # each member's rows together
        members, starts = np.unique(member[sort], return_index=True)
        for m, part in zip(members, np.split(sort, starts[1:]), strict=True):
            places.append((group[m], j, at[part], found[1][part], found[2][part], order))
        if kind == "exact" or (len(group) == 1 and holds_all(stacked, decoded[found[0]])):
            break  # along an axis of exactly 64, or holding all there is: no other rows
    return places


def holds_all(array: np.ndarray, rows: np.ndarray) -> bool:
    """Whether the rows found (one view's: apart in memory) hold every value of the array
    that is not zero (a bfloat16 array's bits: its -0.0 counted, so never too soon)."""
    return np.count_nonzero(array) <= np.count_nonzero(rows)


SAMPLED = 64  # rows a fixed order is looked for in
AGREED = 8  # of them, matched in sorted order, that must give the same order


def fixed_order(rows: np.ndarray, search: Search) -> np.ndarray | None:
    """The one order in which the rows [R, hd] keep their 64 values, if a sample of them,
    each sorted, is the prompt's K/V sorted and at least AGREED of those give the same order:
    a row's value j is its K/V row's value order[j]."""
    sample = rows[:: max(1, len(rows) // SAMPLED)][:SAMPLED].astype(np.float32)
    found = search.sorted_index.match(np.sort(sample, axis=1))
    if found is None or len(found[0]) < AGREED:
        return None
    orders = np.empty((len(found[0]), rows.shape[1]), dtype=np.int64)
    for n, (r, t) in enumerate(zip(found[0], found[1], strict=True)):
        orders[n, np.argsort(sample[r])] = np.argsort(search.index.units[t])
    values, counts = np.unique(orders, axis=0, return_counts=True)
    best = int(np.argmax(counts))
    return values[best] if counts[best] >= AGREED else None


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
