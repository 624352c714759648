"""The objects a cache is made of, inside the student's process (part of the worker: imports
nothing of the grader): all float memory (cache_memory.py) reachable from a root, breadth first
and with no depth limit (a linked list of a thousand nodes is as reachable as a dict), through
lists, tuples, dicts, sets, deques, objects, slots, closures, partials, suspended generators,
object arrays, the course's own classes and callable objects such as a PyTorch module. Never
the weights: arrays mapped from the weights file, the weights argument's, and copies of either
(recognised by shape and first values).
"""

import collections
import functools
import os
import sys

if __package__:
    from . import cache_memory, protocol
else:  # loaded by its path, as the worker loads its parts (swap.part): these first
    cache_memory = sys.modules["_theinference_worker_cache_memory"]
    protocol = sys.modules["_theinference_worker_protocol"]
Source, as_sources, base_of = cache_memory.Source, cache_memory.as_sources, cache_memory.base_of
address = cache_memory.address

MAX_OBJECTS = 1_000_000  # objects the walk visits at most


class Walk:
    """Every object reachable from the roots, breadth first (a linked list of a thousand nodes
    is as reachable as a dict), and the float arrays among them."""

    def __init__(self, skip: "WeightSkip", classes: frozenset = frozenset()):
        self.skip = skip
        self.classes = classes  # ids of the course's own classes, whose attributes are walked
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
        """Keep obj's float memory when it has some; else the objects it holds. An object the
        walk cannot read (a closed BytesIO, a buffer of an odd format, an attribute that
        raises) is passed over: one odd object never ends the search for the cache."""
        try:
            sources = as_sources(obj)
            if sources is None:
                return children(obj, self.classes)
        except Exception:  # noqa: BLE001 (anything of the student's may raise when read)
            return []
        for source in sources:
            for candidate in (source, base_of(source)):
                self.keep(candidate)
        return []

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
        # a model's parameter of a weight's shape is a weight, even before it is loaded
        weight_shaped = source.parameter and tuple(a.shape) in getattr(self.skip, "starts", {})
        if weight_shaped or self.skip(a):
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


NOT_WALKED = (str, bytes, int, float, complex, bool, type(None))


def children(obj, classes: frozenset = frozenset()) -> list:
    """The objects obj holds: items, values, attributes, slots, a closure's cells, a bound
    method's object, a partial's function and arguments, a suspended generator's variables,
    an object array's items, the attributes of the course's own classes (`classes`). Never a
    module's or a function's globals (the whole program), nor a library's classes."""
    import types

    if isinstance(obj, (*NOT_WALKED, types.ModuleType)):
        return []
    if isinstance(obj, type):
        return list(vars(obj).values()) if id(obj) in classes else []
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
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    frame = suspended_frame(obj)
    if frame is not None:
        return list(frame.f_locals.values())
    if is_object_array(obj):
        return list(obj.ravel()[:MAX_OBJECTS])
    return attributes(obj)


def attributes(obj) -> list:
    """An object's attribute values and slots."""
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


def suspended_frame(obj):
    """A generator's, coroutine's or async generator's frame, while it is suspended."""
    import types

    for kind, name in ((types.GeneratorType, "gi_frame"), (types.CoroutineType, "cr_frame"),
                       (types.AsyncGeneratorType, "ag_frame")):
        if isinstance(obj, kind):
            return getattr(obj, name)
    return None


def is_object_array(obj) -> bool:
    import numpy as np

    return isinstance(obj, np.ndarray) and obj.dtype.kind == "O"


def cell_filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


class WeightSkip:
    """Tells the weights from the cache: arrays in memory mapped from the weights file, the
    arrays of the weights argument, and copies of either (a PyTorch model's parameters), known
    by their shape and first values."""

    def __init__(self, weights):
        path = self.path = os.environ.get("THEINFERENCE_WEIGHTS", "")
        self.ranges = mapped_ranges(path)
        self.looked: set[int] = set()  # large arrays' addresses the mappings were read again for
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
        if start in self.addresses or self.mapped(start):
            return True
        firsts = self.starts.get(tuple(a.shape)) if a.size >= SIGNED else None
        if bool(firsts) and first_values(a) in firsts:
            return True
        if a.nbytes >= LARGE and start not in self.looked:  # mapped since the skip was made?
            self.looked.add(start)
            self.ranges = mapped_ranges(self.path)
            return self.mapped(start)
        return False

    def mapped(self, start: int) -> bool:
        return any(lo <= start < hi for lo, hi in self.ranges)


SIGNED = protocol.SWAP["weights_signed"]  # arrays this large: compared with the weights
LARGE = 64 << 20  # bytes: an array this large not known is looked for in the mappings again


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
