"""The swap of a cache's K/V, inside the student's process (part of the worker: imports nothing
of the grader): the K/V are located by content, whatever the layout, and overwritten in place.

What every correct cache holds, whatever its layout, is each layer's K and V rows: for every
head and position, 64 numbers (one head's key or value at one position), somewhere in memory,
possibly scaled (keys pre-scaled by 1/sqrt(64)) and in any float dtype. So the search is by
row, not by shape: every float array reachable from the roots (NumPy arrays, PyTorch tensors
through a shared view, bfloat16 included, `array.array`; through lists, tuples, dicts, sets,
deques, objects, slots, closures and callable objects such as a PyTorch module; no depth limit)
is read, along every axis whose length is a multiple of 64, as rows of 64 consecutive values,
and each row is matched by direction with the rows the grader sent. Fused K|V, paged pools,
arenas, one array per token or per head, interleaved heads, transposed keys, read-only arrays
and linked nodes are all rows. Only when every row of every layer's K and V is found is
anything written: each place found, in place, in its own dtype and scale. The weights (mapped
from their file, or copied: recognised by their first values) are never searched nor written.
"""

import importlib
import importlib.util
import os
import sys


def part(name: str):
    """A module of this folder: by its package where the grader imports this one (its tests),
    else by its path, as the worker loads its own modules (worker.sibling)."""
    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    key = f"_theinference_worker_{name}"
    if key not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(key, path)
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


protocol = part("protocol")  # first: cache_rows reads it
cache_walk, cache_rows = part("cache_walk"), part("cache_rows")
Walk, WeightSkip, RowIndex = cache_walk.Walk, cache_walk.WeightSkip, cache_rows.RowIndex
row_views = cache_rows.row_views


def swap_cache(roots: list, weights, plan: dict, blobs: list) -> dict:
    """One search and swap (see Target.swap) of a plan decoded for it alone."""
    return Target(plan, blobs).swap(roots, weights)


class Target:
    """The grader's swap, decoded once for a call and searched for at each moment the hook
    asks: each layer's K and V to find and to write (plan: layers, heads, head_dim, n; blobs:
    per layer float32 [heads, n, head_dim], in protocol.json's blob order). The rows' index is
    built once, and a large array already searched with no row found is searched again only
    when its bytes have changed: a moment costs its walk, not a search of all it can reach."""

    def __init__(self, plan: dict, blobs: list):
        import numpy as np

        self.layers, h, self.hd, n = (int(plan[k]) for k in protocol.SWAP_PLAN)
        dtype, order = np.dtype(protocol.SWAP["blob_dtype"]), protocol.BLOB_ORDER
        arrays = [np.frombuffer(b, dtype=dtype).reshape(h, n, self.hd) for b in blobs]
        per = [dict(zip(order, arrays[len(order) * i : len(order) * (i + 1)], strict=True))
               for i in range(self.layers)]
        self.finds = np.stack([layer[f"find_{kv}"] for layer in per for kv in "kv"])  # [2L,h,n,hd]
        self.writes = np.stack([layer[f"write_{kv}"] for layer in per for kv in "kv"])
        self._index = None
        self.barren: dict = {}  # array's place -> digest of its bytes when no row was found
        self.unnamed_weights = None  # the WeightSkip of a search given no weights, kept

    @property
    def index(self):
        if self._index is None:
            self._index = RowIndex(self.finds.reshape(-1, self.hd))
        return self._index

    def swap(self, roots: list, weights) -> dict:
        """Find each layer's K and V among what `roots` reach and, when every row is found,
        overwrite them. What was done or found, for the grader's message."""
        import numpy as np

        walk = Walk(skip=self.weight_skip(weights))
        for root in roots:
            walk.visit(root)
        held = sum(s.array.size for s in walk.sources)
        if held < self.finds.size:  # cheap: not yet there (a cache half built, or none)
            return {
                "applied": False,
                "reason": f"{held} values found, fewer than the {self.finds.size} of every "
                f"layer's K and V, among {walk.describe()}",
                "seen": walk.summary(),
            }
        index, hd = self.index, self.hd
        places, covered = [], np.zeros(len(index), dtype=bool)
        for group in alike(walk.sources):
            for place in self.located(group):
                places.append(place)
                covered[place[3]] = True
        if not covered.all():
            n_rows = covered.size // (2 * self.layers)
            return {
                "applied": False,
                "reason": missing_reason(covered.reshape(2 * self.layers, n_rows), walk, hd),
                "seen": walk.summary(),
            }
        spans = writable_spans() if any(not p[1].flags.writeable for p in places) else []
        try:  # every place made writeable first: a swap is whole or nothing
            targets = [writable(place[1], spans) for place in places]
        except PermissionError as exc:
            return {"applied": False, "reason": str(exc), "seen": walk.summary()}
        flat = self.writes.reshape(-1, hd)
        for target, (source, _, at, found, scale) in zip(targets, places, strict=True):
            write_rows(source, target, at, scale[:, None] * flat[found])
        return {"applied": True, "reason": "", "places": len(places), "seen": walk.summary()}

    def weight_skip(self, weights) -> "WeightSkip":
        """The weights' skip; with none named (the moments after the prefill), the one made at
        the first moment, whose reading of this process's mappings (/proc/self/maps, some ms)
        is not made again at every return. Weights mapped later are still known by their
        shape and first values."""
        if weights is not None:
            return WeightSkip(weights)
        if self.unnamed_weights is None:
            self.unnamed_weights = WeightSkip(None)
        return self.unnamed_weights

    def located(self, group: list) -> list:
        """locate(), skipping a large array searched before, unchanged and with no row."""
        if len(group) > 1 or group[0].array.size <= SMALL:
            return locate(group, self.index, self.hd)
        a = group[0].array
        place = (cache_walk.address(a), a.shape, a.strides, a.dtype.str)
        digest = bytes_digest(a)
        if digest is not None and self.barren.get(place) == digest:
            return []
        found = locate(group, self.index, self.hd)
        if not found and digest is not None:
            self.barren[place] = digest
        return found


def bytes_digest(a) -> int | None:
    """A checksum of a contiguous array's bytes (about 2 GB/s), or None for a strided one."""
    import zlib

    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        return None
    return zlib.crc32(memoryview(a.reshape(-1, order="A")).cast("B"))


SMALL = 1 << 16  # arrays up to this size are matched together with those of their shape


def alike(sources: list) -> list[list]:
    """The sources in groups matched at once: small arrays of one shape and dtype together (a
    thousand per-token rows are one search, not a thousand), every other array alone."""
    groups: dict = {}
    for i, source in enumerate(sources):
        a = source.array
        key = (a.shape, a.dtype.str, source.bf16) if a.size <= SMALL else i
        groups.setdefault(key, []).append(source)
    return list(groups.values())


def locate(group: list, index, hd: int) -> list:
    """(source, rows view, row numbers, targets, scales) for every row of the group's arrays
    that is a target's, along the axes row_views reads (one of exactly 64 found: no other)."""
    import numpy as np

    places = []
    views = [row_views(source.array, hd) for source in group]  # alike: the same axes each
    for j, (_, exact) in enumerate(views[0]):
        rows = [group_views[j][0] for group_views in views]
        per = int(np.prod(rows[0].shape[:-1]))
        stacked = np.stack([s.decode(r).reshape(-1, hd) for s, r in zip(group, rows, strict=True)])
        found = index.match(stacked.reshape(-1, hd))
        if found is None:
            continue
        member, at = np.divmod(found[0], per)
        order = np.argsort(member, kind="stable")  # each member's rows together
        members, starts = np.unique(member[order], return_index=True)
        for m, part in zip(members, np.split(order, starts[1:]), strict=True):
            places.append((group[m], rows[m], at[part], found[1][part], found[2][part]))
        if exact:
            break  # rows along an axis of exactly 64: the other axes hold none
    return places


def missing_reason(covered, walk: "Walk", hd: int) -> str:
    """Which layer's K or V is missing first, how much of it was found, and what was seen."""
    tensors = len(covered)
    missing = [t for t in range(tensors) if not covered[t].all()]
    layer, kind = divmod(missing[0], 2)
    rows = covered[missing[0]]
    return (
        f"layer {layer}'s {'KV'[kind]} ({len(missing)} of {tensors} K/V tensors incomplete; "
        f"{int(rows.sum())} of {rows.size} of its rows of {hd} values, one per head and "
        f"position, found) was not found among {walk.describe()}"
    )


def write_rows(source, target, at, values) -> None:
    """values [len(at), hd] into the rows numbered `at` (flat over the leading axes) of a
    writeable view of the source, in its own dtype (a bfloat16 tensor's by its bits)."""
    import numpy as np

    if target.ndim == 1:  # one row alone ([hd]): a view [1, hd], so that its row is numbered
        target = target[None]
    where = np.unravel_index(at, target.shape[:-1])
    if source.bf16:
        bits = values.astype(np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # to nearest, ties to even
        target[where] = rounded.astype(np.uint16).view(target.dtype)
    else:
        target[where] = values.astype(target.dtype)


def writable(view, spans: list):
    """The same memory as `view`, writeable: a read-only flag (set by the student's code) is
    not the memory's. Memory the system maps read-only (not in `spans`) is never written."""
    import numpy as np

    if view.flags.writeable:
        return view
    lo, hi = extent(view)
    if not in_writable_memory(lo, hi, spans):
        raise PermissionError("the K/V sit in memory mapped read-only")
    import ctypes

    raw = (ctypes.c_char * (hi - lo)).from_address(lo)
    base = np.frombuffer(raw, dtype=np.uint8)
    offset = cache_walk.address(view) - lo
    return np.lib.stride_tricks.as_strided(
        base[offset:].view(view.dtype), shape=view.shape, strides=view.strides
    )


def extent(view) -> tuple[int, int]:
    """The lowest and one past the highest byte address the view touches."""
    start = cache_walk.address(view)
    low = start + sum(s * (n - 1) for s, n in zip(view.strides, view.shape, strict=True) if s < 0)
    high = start + sum(s * (n - 1) for s, n in zip(view.strides, view.shape, strict=True) if s > 0)
    return low, high + view.itemsize


def writable_spans() -> list[tuple[int, int]]:
    """The address ranges this process may write, sorted (/proc/self/maps, read once a swap)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    return sorted(
        (int(a, 16), int(b, 16))
        for span, perms in (line.split()[:2] for line in lines)
        if "w" in perms
        for a, b in [span.split("-")]
    )


def in_writable_memory(lo: int, hi: int, spans: list) -> bool:
    """Whether every byte of [lo, hi) lies in the writeable spans (a range may span several:
    the kernel does not always merge neighbouring mappings)."""
    reached = lo
    for start, end in spans:
        if start <= reached < end:
            reached = end
        if reached >= hi:
            return True
    return False
