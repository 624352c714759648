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

import collections
import functools
import itertools
import os

MAX_OBJECTS = 1_000_000  # objects the walk visits at most
TOL = 2e-3  # max |difference| of two rows scaled to unit length: float16 storage passes
AMBIGUOUS = 4.0  # a row nearer than this factor to its second-best target names it
CHUNK = 1 << 16  # rows matched at a time (bounds the matcher's memory)


def swap_cache(roots: list, weights, plan: dict, blobs: list) -> dict:
    """Find each layer's K and V (plan: layers, heads, head_dim, n; blobs: per layer the K and
    V to find, then the K and V to write, float32 [heads, n, head_dim]) and, when every row is
    found, overwrite them. What was done or found, for the grader's message."""
    import numpy as np

    h, hd, n, layers = (int(plan[k]) for k in ("heads", "head_dim", "n", "layers"))
    arrays = [np.frombuffer(b, dtype=np.float32).reshape(h, n, hd) for b in blobs]
    finds = np.stack([arrays[4 * layer + i] for layer in range(layers) for i in (0, 1)])
    writes = np.stack([arrays[4 * layer + 2 + i] for layer in range(layers) for i in (0, 1)])
    walk = Walk(skip=WeightSkip(weights))
    for root in roots:
        walk.visit(root)
    held = sum(s.array.size for s in walk.sources)
    if held < finds.size:  # cheap: not yet there (a cache half built, or none)
        return {
            "applied": False,
            "reason": f"{held} values found, fewer than the {finds.size} of every layer's K "
            f"and V, among {walk.describe()}",
            "seen": walk.summary(),
        }
    index = RowIndex(finds.reshape(-1, hd))
    places, covered = [], np.zeros(len(index), dtype=bool)
    for source in walk.sources:
        for rows, exact in row_views(source.array, hd):
            found = index.match(source.decode(rows).reshape(-1, hd))
            if found is not None:
                places.append((source, rows, *found))
                covered[found[1]] = True
                if exact:
                    break  # rows along an axis of exactly 64: the other axes hold none
    if not covered.all():
        return {
            "applied": False,
            "reason": missing_reason(covered.reshape(2 * layers, h * n), walk, hd),
            "seen": walk.summary(),
        }
    flat = writes.reshape(-1, hd)
    for source, rows, at, targets, scale in places:
        source.write(rows, at, scale[:, None] * flat[targets])
    return {"applied": True, "reason": "", "places": len(places), "seen": walk.summary()}


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


# --- walking the cache's objects ----------------------------------------------------------------


class Source:
    """One float array reachable from the cache, read and written in its own dtype: a NumPy
    array, or a PyTorch bfloat16 tensor's bits (`bf16`)."""

    def __init__(self, array, bf16: bool = False):
        self.array, self.bf16 = array, bf16

    def decode(self, rows):
        import numpy as np

        if self.bf16:  # the upper half of a float32's bits
            return (rows.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return rows

    def write(self, rows, at, values) -> None:
        """values [len(at), hd] into the rows numbered `at` (flat over the leading axes)."""
        import numpy as np

        target = writable(rows)
        where = np.unravel_index(at, rows.shape[:-1])
        if self.bf16:
            bits = values.astype(np.float32).view(np.uint32)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # to nearest, ties to even
            target[where] = rounded.astype(np.uint16).view(target.dtype)
        else:
            target[where] = values.astype(target.dtype)


class Walk:
    """Every object reachable from the roots, breadth first (a linked list of a thousand nodes
    is as reachable as a dict), and the float arrays among them."""

    def __init__(self, skip: "WeightSkip"):
        self.skip = skip
        self.seen: set[int] = set()
        self.places: set[tuple] = set()  # (address, shape, strides, dtype) of each array kept
        self.sources: list[Source] = []
        self.skipped = 0  # weights recognised and left alone
        self.limited = False

    def visit(self, root) -> None:
        queue = collections.deque([root])
        while queue:
            obj = queue.popleft()
            if id(obj) in self.seen:
                continue
            if len(self.seen) >= MAX_OBJECTS:
                self.limited = True
                return
            self.seen.add(id(obj))
            queue.extend(self.take(obj))

    def take(self, obj) -> list:
        """Keep obj when it is an array; else the objects it holds."""
        source = as_source(obj)
        if source is not None:
            for candidate in (source, base_of(source)):
                self.keep(candidate)
            return []
        return children(obj)

    def keep(self, source: "Source | None") -> None:
        if source is None:
            return
        a = source.array
        if a.dtype.kind not in "fiu" or (a.dtype.kind in "iu" and not source.bf16):
            return
        key = (address(a), a.shape, a.strides, a.dtype.str)
        if key in self.places:
            return
        self.places.add(key)
        if self.skip(a):
            self.skipped += 1
            return
        self.sources.append(source)

    def summary(self) -> dict:
        return {"objects": len(self.seen), "arrays": len(self.sources), "limited": self.limited}

    def describe(self) -> str:
        """What was found, for a student to compare with where their cache keeps its K/V."""
        kinds = collections.Counter(
            f"{'bfloat16' if s.bf16 else s.array.dtype.name} {list(s.array.shape)}"
            + ("" if s.array.flags.writeable else " read-only")
            for s in self.sources
        )
        shown = ", ".join(f"{count} x {kind}" for kind, count in kinds.most_common(6))
        more = f" and {len(kinds) - 6} other shapes" if len(kinds) > 6 else ""
        weights = f"; {self.skipped} weight arrays left out" if self.skipped else ""
        cut = f"; the walk stopped at {MAX_OBJECTS} objects" if self.limited else ""
        return (
            f"{len(self.sources)} float arrays reachable from the cache ({shown or 'none'}{more}"
            f"{weights}), {len(self.seen)} objects walked{cut}"
        )


NOT_WALKED = (str, bytes, bytearray, int, float, complex, bool, type(None), type)


def children(obj) -> list:
    """The objects obj holds: items, values, attributes, slots, a closure's cells, a bound
    method's object. Never a module's or a function's globals (the whole program)."""
    import types

    if isinstance(obj, (*NOT_WALKED, types.ModuleType)):
        return []
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return list(obj)
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, types.FunctionType):
        return [cell.cell_contents for cell in obj.__closure__ or () if cell_filled(cell)]
    if isinstance(obj, types.BuiltinFunctionType):
        return []
    held = []
    try:
        held += list(object.__getattribute__(obj, "__dict__").values())
    except (AttributeError, TypeError):
        pass
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            try:
                held.append(object.__getattribute__(obj, slot))
            except (AttributeError, TypeError):
                pass
    return held


def cell_filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def as_source(obj) -> "Source | None":
    """obj as a float array sharing its memory, or None: NumPy arrays, PyTorch tensors (a
    bfloat16 one by its bits), `array.array` and float memoryviews."""
    import array

    import numpy as np

    if isinstance(obj, np.ndarray):
        return Source(obj)
    if isinstance(obj, (array.array, memoryview)):
        try:
            a = np.asarray(obj)
        except (TypeError, ValueError):
            return None
        return Source(a) if a.dtype.kind == "f" else None
    if type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "detach"):
        return torch_source(obj)
    return None


def torch_source(tensor) -> "Source | None":
    try:
        t = tensor.detach()
        if str(t.dtype) == "torch.bfloat16":
            import torch

            return Source(t.view(torch.int16).numpy(), bf16=True)
        return Source(t.numpy())
    except Exception:  # noqa: BLE001 (on another device, sparse, ...: not readable here)
        return None


def base_of(source: Source) -> "Source | None":
    """The array a view was taken from (a preallocated buffer behind a sliced view)."""
    import numpy as np

    base = source.array.base
    if isinstance(base, np.ndarray) and base.dtype == source.array.dtype:
        return Source(base, source.bf16)
    return None


def address(a) -> int:
    return a.__array_interface__["data"][0]


class WeightSkip:
    """Tells the weights from the cache: arrays in memory mapped from the weights file, the
    arrays of the weights argument, and copies of either (a PyTorch model's parameters), known
    by their shape and first values."""

    def __init__(self, weights):
        path = os.environ.get("THEINFERENCE_WEIGHTS", "")
        self.ranges = mapped_ranges(path)
        self.starts = collections.defaultdict(set)
        for shape, firsts in file_signatures(path).items():
            self.starts[shape] |= firsts
        walk = Walk(skip=lambda a: False)
        if weights is not None:
            walk.visit(weights)
        self.addresses = {address(s.array) for s in walk.sources}
        for source in walk.sources:
            if source.array.size >= SIGNED:
                self.starts[tuple(source.array.shape)].add(first_values(source.array))

    def __call__(self, a) -> bool:
        start = address(a)
        if start in self.addresses or any(lo <= start < hi for lo, hi in self.ranges):
            return True
        firsts = self.starts.get(tuple(a.shape)) if a.size >= SIGNED else None
        return bool(firsts) and first_values(a) in firsts


SIGNED = 4096  # arrays this large are compared with the weights' first values


def first_values(a) -> bytes:
    """The first 16 values in C order (of the first row, where rows are that long)."""
    import numpy as np

    row = a[(0,) * (a.ndim - 1)] if a.ndim > 1 else a
    return np.asarray(row[:16], dtype=np.float32).tobytes()


@functools.cache
def file_signatures(path: str) -> dict:
    """shape -> the first values of each float32 tensor of a .safetensors file, and of its
    transpose, read from the file's header and first rows without mapping it whole."""
    import json
    import struct

    import numpy as np

    starts = collections.defaultdict(set)
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
            for name, t in header.items():
                shape = tuple(t["shape"]) if name != "__metadata__" else ()
                if t.get("dtype") != "F32" or not 1 <= len(shape) <= 2:
                    continue
                if int(np.prod(shape)) < SIGNED or shape[-1] < 16:
                    continue
                f.seek(8 + size + t["data_offsets"][0])
                rows = min(16, shape[0]) if len(shape) == 2 else 1
                first = np.frombuffer(f.read(4 * rows * shape[-1]), dtype="<f4")
                first = first.reshape(rows, -1) if len(shape) == 2 else first[None]
                starts[shape].add(first[0, :16].astype(np.float32).tobytes())
                if len(shape) == 2 and rows == 16:
                    starts[shape[::-1]].add(first[:16, 0].astype(np.float32).tobytes())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        pass
    return {shape: frozenset(firsts) for shape, firsts in starts.items()}


def mapped_ranges(path: str) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of `path` (the weights file)."""
    if not path:
        return []
    try:
        real = os.path.realpath(path)
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] in (path, real):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            ranges.append((lo, hi))
    return ranges


def writable(view):
    """The same memory as `view`, writeable: a read-only flag (set by the student's code) is
    not the memory's. Memory the system maps read-only is never written."""
    import numpy as np

    if view.flags.writeable:
        return view
    lo, hi = extent(view)
    if not in_writable_memory(lo, hi):
        raise PermissionError("the K/V sit in memory mapped read-only")
    import ctypes

    raw = (ctypes.c_char * (hi - lo)).from_address(lo)
    base = np.frombuffer(raw, dtype=np.uint8)
    offset = address(view) - lo
    return np.lib.stride_tricks.as_strided(
        base[offset:].view(view.dtype), shape=view.shape, strides=view.strides
    )


def extent(view) -> tuple[int, int]:
    """The lowest and one past the highest byte address the view touches."""
    start = address(view)
    low = start + sum(s * (n - 1) for s, n in zip(view.strides, view.shape, strict=True) if s < 0)
    high = start + sum(s * (n - 1) for s, n in zip(view.strides, view.shape, strict=True) if s > 0)
    return low, high + view.itemsize


def in_writable_memory(lo: int, hi: int) -> bool:
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return False
    for line in lines:
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= lo and hi <= end:
            return "w" in perms
    return False


# --- reading an array as rows -----------------------------------------------------------------


def row_views(a, hd: int) -> list:
    """Views [..., hd] of the array: along every axis whose length is a multiple of hd (axes
    of exactly hd first), that axis moved last and split into runs of hd consecutive values
    (a merged [N, 768] row is 12 heads of 64; a fused K|V row 24), each with whether its axis
    is exactly hd long. Views only: writing one writes the array."""
    import numpy as np

    if a.ndim == 0 or a.size < hd:
        return []
    views = []
    exact_first = sorted(range(a.ndim), key=lambda axis: a.shape[axis] != hd)
    for axis in exact_first:
        length = a.shape[axis]
        if length % hd:
            continue
        moved = np.moveaxis(a, axis, -1)
        # splitting one axis in two is always a view, whatever its stride
        split = moved.reshape(*moved.shape[:-1], length // hd, hd) if length > hd else moved
        views.append((split, length == hd))
    return views


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
        """(rows, targets): each of the rows `live` within `tol` of a target, with it."""
        import numpy as np

        rows, targets = self.grids[tol].pairs(units[live, :3], live)
        err = np.abs(units[rows] - self.units[targets]).max(axis=1) if rows.size else rows
        near = err <= tol
        rows, targets, err = rows[near], targets[near], err[near]
        if rows.size == 0:
            return rows, targets
        order = np.lexsort((err, rows))  # per row, best first
        rows, targets, err = rows[order], targets[order], err[order]
        first = np.r_[True, rows[1:] != rows[:-1]]
        runner_up = np.full(rows.size, np.inf)
        runner_up[:-1] = np.where(~first[1:], err[1:], np.inf)
        clear = first & (runner_up > AMBIGUOUS * np.maximum(err, 1e-7))
        return rows[clear], targets[clear]


PASSES = (1e-4, TOL)  # the tight pass, then the loose one for the rows it left


class Grid:
    """Points (three values each) hashed on a grid of `cell`: a query within half a cell of a
    point, in every value, is in one of the 8 cells around the query's corner nearest it."""

    def __init__(self, points, cell: float):
        import numpy as np

        self.cell = cell
        cells = cell_ids(np.floor(points / cell))
        self.order = np.argsort(cells, kind="stable")
        self.cells = cells[self.order]

    def pairs(self, queries, numbers):
        """(query number, point index) for every point in the 8 cells near each query."""
        import numpy as np

        scaled = queries / self.cell
        base = np.floor(scaled)
        toward = np.where(scaled - base < 0.5, -1.0, 1.0)  # the nearer neighbour, per value
        rows_out, points_out = [], []
        for step in itertools.product((0.0, 1.0), repeat=3):
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
