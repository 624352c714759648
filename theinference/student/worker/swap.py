"""The swap of a cache's K/V, inside the student's process (part of the worker: imports nothing
of the grader): what the process holds is sent to the grader, which finds the K/V by content
(curriculum/checks/swap_search.py), and the rows it names are overwritten in place.

What every correct cache holds, whatever its layout, is each layer's K and V rows: for every
head and position, 64 numbers somewhere in memory. So every float array reachable from the
roots (NumPy arrays, PyTorch tensors through a shared view, bfloat16 included, `array.array`;
through lists, tuples, dicts, sets, deques, objects, slots, closures and callable objects such
as a PyTorch module; no depth limit) is sent, and the grader reads it as rows. Nothing of the
proof comes here before the answer: not the prompt's K/V (the grader keeps them to search
with), not the swap's values until the cache they are written to has been found, and no status
of this process's decides a pass. The weights (mapped from their file, or copied: recognised by
their first values) are never sent nor written.
"""

import importlib
import importlib.util
import itertools
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
cache_memory = part("cache_memory")  # before cache_walk, which reads it
cache_walk, cache_rows = part("cache_walk"), part("cache_rows")
held = part("held")  # after cache_walk, which it reads
Walk, WeightSkip = cache_walk.Walk, cache_walk.WeightSkip
each_row_view = cache_rows.each_row_view


class Target:
    """The grader's swap in this process, for a call: at each moment the hook asks, the float
    arrays reachable from the roots are sent to the grader (whole, in their own dtype), which
    searches them for the prompt's K/V (which never come here) and answers with the rows to
    overwrite and their new values, or with why it found no cache. Whether the swap happened is
    the grader's to judge, by the answer alone: nothing this process says passes a case. An
    array the grader found no row in is sent again only when its bytes have changed."""

    def __init__(self, plan: dict, exchange):
        self.layers, h, self.hd, n = (int(plan[k]) for k in protocol.SWAP_PLAN)
        self.needed = 2 * self.layers * h * n * self.hd  # every layer's K and V: the least held
        self.exchange = exchange
        # array's place -> (checksum of its bytes, its number) when the grader searched it:
        # the number None where no row was in it (not sent again while unchanged), else the
        # grader keeps what it found there, and the unchanged array is named, not sent
        self.searched: dict = {}
        self.numbered = 0  # numbers given to arrays sent
        self.unnamed_weights = None  # the WeightSkip of a search given no weights, kept
        self.last_sent: list = []  # the places and checksums of what was sent last
        self.one_signed = False  # the grader said an array of one sign holds no row

    def swap(self, roots: list, weights, classes: frozenset = frozenset()) -> dict:
        """Send what `roots` reach (through the attributes of `classes`, the course's own, too)
        to the grader and write the rows it answers with: what was done, for the grader's
        message (never for a pass)."""
        walk = Walk(skip=self.weight_skip(weights), classes=classes)
        for root in roots:
            walk.visit(root)
        # what was sent before and held no row, unchanged since, holds none now: not counted,
        # not sent again (a moment costs its walk, not a copy of all it can reach); nor is an
        # array no axis of which is a multiple of head_dim (the grader reads it as no rows)
        fresh, readable = [], [s for s in walk.sources if holds_rows(s.array, self.hd)]
        if sum(s.array.size for s in readable) >= self.needed:  # else not yet there: cheap
            fresh = self.unseen(readable)
        found = sum(s.array.size for s, _ in fresh)
        if found < self.needed:  # a cache half built, or none
            return {
                "applied": False,
                "reason": f"{found} values found (besides arrays found to hold no K/V before), "
                f"fewer than the {self.needed} of every layer's K and V, among "
                f"{walk.describe()}",
                "seen": walk.summary(),
            }
        marks = [m for _, m in fresh]
        if marks == self.last_sent:  # what the grader last searched, unchanged: same answer
            return {"applied": False, "reason": "unchanged since the grader last looked",
                    "seen": walk.summary()}
        self.last_sent = marks
        sent = [s for s, _ in fresh]
        descriptions, blobs = held.sent_arrays(fresh, self.searched, self.numbered)
        self.numbered += len(blobs)  # one number an array sent, whatever the answer
        word = {"outcome": "hooked", "probe": {"held": descriptions, "about": walk.describe()}}
        answer, back = self.exchange(word, blobs)
        self.learn(fresh, descriptions, answer.get("barren"))
        self.one_signed = self.one_signed or answer.get("one_signed") is True
        writes = answer.get("write")
        if not isinstance(writes, list):
            reason = str(answer.get("reason", "the grader found no cache"))
            return {"applied": False, "reason": reason, "seen": walk.summary(),
                    "stop": answer.get("stop") is True}
        try:
            write_all(sent, writes, back, self.hd)
        except PermissionError as exc:
            return {"applied": False, "reason": str(exc), "seen": walk.summary()}
        return {"applied": True, "reason": "", "places": len(writes), "seen": walk.summary()}

    def learn(self, fresh: list, descriptions: list, barren) -> None:
        """What the grader's answer tells of the arrays sent: which held no row (not sent
        again while unchanged) and which did (named by their number while unchanged). An
        answer with no such list (the search failed, or no swap is due) tells nothing."""
        if not isinstance(barren, list):
            return
        barren = {i for i in barren if isinstance(i, int)}
        for i, ((_, (place, digest)), description) in enumerate(zip(fresh, descriptions,
                                                                    strict=True)):
            if "number" in description:  # sent (one named Known the grader has already)
                number = None if i in barren else description["number"]
                self.searched[place] = (digest, number)

    def unseen(self, sources: list) -> list:
        """(source, its mark) of the arrays that may hold a row the grader has not looked at:
        not all zeros (no K/V row is: a cache preallocated before its prefill), not found
        barren before and unchanged since, and, once the grader has said so, not of one sign
        (held.one_signed: attention probabilities)."""
        fresh = []
        for source in sources:
            seen = held.mark(source.array)
            if seen is None:
                continue
            before = self.searched.get(seen[0])
            if before is not None and before[0] == seen[1]:  # unchanged since searched:
                if before[1] is not None:  # rows were found in it, named by its number
                    fresh.append((source, seen))
                continue
            if self.one_signed and not source.bf16 and held.one_signed(source.array):
                self.searched[seen[0]] = (seen[1], None)  # no row, as the grader would find
                continue
            fresh.append((source, seen))
        return fresh

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



def holds_rows(a, hd: int) -> bool:
    """Whether cache_rows.row_views reads any row of head_dim values in the array."""
    return a.size >= hd and any(n % hd == 0 for n in a.shape)


def write_all(sources: list, writes: list, blobs: list, hd: int) -> None:
    """The grader's writes, each {held, view, rows, values}: the rows numbered `rows` (int64)
    of the array's row view `view` (cache_rows.row_views) get `values` (float32 [rows, hd]).
    Every place is made writeable first: a swap is whole or nothing."""
    import numpy as np

    places = []
    for w in writes:
        source = sources[int(w["held"])]
        view = next(itertools.islice(each_row_view(source.array, hd), int(w["view"]), None))[0]
        rows = np.frombuffer(blobs[int(w["rows"])], dtype=np.int64)
        values = np.frombuffer(blobs[int(w["values"])], dtype=np.float32).reshape(-1, hd)
        places.append((source, view, rows, values))
    spans = writable_spans() if any(not p[1].flags.writeable for p in places) else []
    targets = [writable(view, spans) for _, view, _, _ in places]
    for target, (source, _, rows, values) in zip(targets, places, strict=True):
        write_rows(source, target, rows, values)
        if source.commit is not None:  # a copy (of a list of floats): put back where it lives
            source.commit()


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
