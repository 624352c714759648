"""The swap of a cache's K/V, inside the student's process (part of the worker: imports nothing
of the grader): the K/V are located by content, whatever the layout, and overwritten in place.

Every array reachable from the cache argument (NumPy arrays, PyTorch tensors through a shared
NumPy view, through lists, tuples, dicts, objects and slots; never the weights) is read as
[n_head, N, head_dim] in any axis order, as merged heads [N, d], as one head [N, head_dim], as
one position [n_head, head_dim] or as one row [head_dim], leading axes split off (stacked or
preallocated buffers) and singleton axes dropped, and compared with the K/V the grader computed
for the same prompt. Only when every layer's K and V is found is anything written: each place
found, in place, in its own layout and dtype.
"""

from itertools import permutations

MAX_DEPTH = 8  # how deep into the cache's objects the search goes
MAX_SPLIT = 4096  # leading axes longer than this are not split into views
ATOL, RTOL = 2e-3, 1e-3  # the student's float32/float64 of the same numbers: loose on purpose


def swap_cache(roots: list, weights, plan: dict, blobs: list) -> dict:
    """Find each layer's K and V (plan: layers, heads, head_dim, n; blobs: per layer the K and
    V to find, then the K and V to write, float32 [heads, n, head_dim]) and, when all are
    found, overwrite them. What was done, for the grader's message."""
    import numpy as np

    h, hd, n, layers = (int(plan[k]) for k in ("heads", "head_dim", "n", "layers"))
    shape = (h, n, hd)
    arrays = [np.frombuffer(b, dtype=np.float32).reshape(shape) for b in blobs]
    finds = [arrays[4 * layer + i] for layer in range(layers) for i in (0, 1)]
    writes = [arrays[4 * layer + 2 + i] for layer in range(layers) for i in (0, 1)]
    candidates = reachable_arrays(roots, skip=weight_addresses(weights))
    places, covered = locate(candidates, finds, h, hd, n)
    missing = [t for t, cells in enumerate(covered) if not cells.all()]
    if missing:
        layer, kind = divmod(missing[0], 2)
        return {
            "applied": False,
            "reason": f"layer {layer}'s {'KV'[kind]} ({len(missing)} of {2 * layers} K/V "
            f"tensors) was not found among {len(candidates)} arrays reachable from the cache",
        }
    for view, target, where in places:
        view[...] = writes[target][where]
    return {"applied": True, "reason": "", "places": len(places)}


def weight_addresses(weights) -> set[int]:
    """Where the weights' arrays start in memory (not their ids: a tensor's NumPy view is a
    new object each time it is asked for, and a dead one's id is soon another's)."""
    if weights is None:
        return set()
    return {a.ctypes.data for a in reachable_arrays([weights], skip=set())}


def reachable_arrays(roots: list, skip: set[int]) -> list:
    """Every writeable float array reachable from roots (a view's base too), never one that
    starts where an address in `skip` does; PyTorch tensors as NumPy views of their memory."""
    found: dict[int, object] = {}
    seen: set[int] = set()
    for root in roots:
        walk(root, found, seen, 0)
    return [a for a in found.values() if a.ctypes.data not in skip]


def walk(obj, found: dict, seen: set, depth: int) -> None:
    import numpy as np

    if id(obj) in seen or depth > MAX_DEPTH:
        return
    seen.add(id(obj))
    array = obj if isinstance(obj, np.ndarray) else shared_numpy(obj)
    if array is not None:
        for a in (array, array.base):
            if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.flags.writeable:
                found.setdefault(id(a), a)
        return
    if isinstance(obj, (str, bytes, int, float, complex, type)) or callable(obj):
        return
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    else:
        slots = [s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())]
        children = [*getattr(obj, "__dict__", {}).values()]
        children += [getattr(obj, s) for s in slots if isinstance(s, str) and hasattr(obj, s)]
    for child in children:
        walk(child, found, seen, depth + 1)


def shared_numpy(obj):
    """A PyTorch tensor's memory as a NumPy array (written through), else None."""
    if type(obj).__module__.split(".")[0] != "torch" or not hasattr(obj, "numpy"):
        return None
    try:
        return obj.detach().numpy()
    except Exception:  # noqa: BLE001 (on another device, bfloat16, ...: not readable here)
        return None


# --- reading an array as K/V rows ----------------------------------------------------------------


def units(array, h: int, hd: int, n: int) -> list:
    """(view, kind) for every way the array may hold K/V: kind "whole" [h, N>=n, hd], "head"
    [N>=n, hd], "position" [h, hd], "run" [hd]. Views only: writing one writes the array."""
    import numpy as np

    out: list = []
    read_as(np.squeeze(array) if array.ndim else array, h, hd, n, out)
    return out


def read_as(x, h: int, hd: int, n: int, out: list) -> None:
    d = h * hd
    if x.ndim >= 3:
        wholes = [] if x.ndim > 3 else [
            y for p in permutations(range(3)) if fits(y := x.transpose(p), h, hd, n)
        ]
        out += [(y, "whole") for y in wholes]
        if not wholes and x.shape[0] <= MAX_SPLIT:
            for i in range(x.shape[0]):  # stacked: layers, K and V, a batch of one
                read_as(x[i], h, hd, n, out)
    elif x.ndim == 2:
        a, b = x.shape
        if b == d and a >= n and (y := as_view(x, (a, h, hd))) is not None:
            out.append((y.transpose(1, 0, 2), "whole"))  # merged heads [N, d]
        if a == d and b >= n and (y := as_view(x, (h, hd, b))) is not None:
            out.append((y.transpose(0, 2, 1), "whole"))  # merged and transposed [d, N]
        if b == hd and a >= n:
            out.append((x, "head"))
        if a == hd and b >= n:
            out.append((x.T, "head"))  # one head's keys transposed
        if (a, b) == (h, hd):
            out.append((x, "position"))
    elif x.ndim == 1:
        if x.size == hd:
            out.append((x, "run"))
        elif x.size == d and (y := as_view(x, (h, hd))) is not None:
            out.append((y, "position"))  # one position's row, heads merged
        elif x.size % d == 0 and (y := as_view(x, (x.size // d, d))) is not None:
            read_as(y, h, hd, n, out)  # a flat buffer: merged rows
            if (z := as_view(x, (h, x.size // d, hd))) is not None and fits(z, h, hd, n):
                out.append((z, "whole"))


def fits(y, h: int, hd: int, n: int) -> bool:
    return y.shape[0] == h and y.shape[2] == hd and y.shape[1] >= n


def as_view(x, shape: tuple):
    """x reshaped without a copy, or None where only a copy could have that shape."""
    y = x.view()
    try:
        y.shape = shape
    except (AttributeError, ValueError):
        return None
    return y


def locate(arrays: list, finds: list, h: int, hd: int, n: int) -> tuple[list, list]:
    """(places, covered): places are (view, target index, where in the target) whose values
    are that target's; covered[t] marks which [head, position] cells of target t were found."""
    import numpy as np

    index = KeyIndex(finds)
    covered = [np.zeros((h, n), dtype=bool) for _ in finds]
    places = []
    for array in arrays:
        for view, kind in units(array, h, hd, n):
            for target, where, region in index.matches(view, kind, n):
                places.append((region, target, where))
                covered[target][where[:2] if kind != "whole" else ...] = True
    return places, covered


class KeyIndex:
    """The first values of every head, position and row of the K/V to find, sorted, so that a
    view is compared only with the few targets that start like it."""

    def __init__(self, finds: list):
        import numpy as np

        self.finds = finds
        self.atol = ATOL * max(float(np.sqrt((t * t).mean())) for t in finds)
        t_count, (h, n, _) = len(finds), finds[0].shape
        grid = np.stack(finds)  # [targets, h, n, hd]
        ids = np.indices((t_count, h, n)).reshape(3, -1).T  # (target, head, position)
        self.tables = {
            "whole": self._table(grid[:, 0, 0, :4], ids[(ids[:, 1] == 0) & (ids[:, 2] == 0)]),
            "head": self._table(grid[:, :, 0, :4].reshape(-1, 4), ids[ids[:, 2] == 0]),
            "position": self._table(grid[:, 0, :, :4].reshape(-1, 4), ids[ids[:, 1] == 0]),
            "run": self._table(grid[..., :4].reshape(-1, 4), ids),
        }

    @staticmethod
    def _table(keys, ids):
        order = keys[:, 0].argsort()
        return keys[order], ids[order]

    def matches(self, view, kind: str, n: int):
        """(target, where, region to write) for every target the view holds."""
        import numpy as np

        first = view[0, 0, :4] if kind == "whole" else view[:4] if kind == "run" else view[0, :4]
        keys, ids = self.tables[kind]
        first = np.asarray(first, dtype=np.float64)
        tol = self.atol + RTOL * abs(first[0])
        lo, hi = np.searchsorted(keys[:, 0], [first[0] - tol, first[0] + tol])
        for row in range(lo, hi):
            if not np.all(np.abs(keys[row] - first) <= self.atol + RTOL * np.abs(first)):
                continue
            target, head, position = (int(i) for i in ids[row])
            region, where = self.region(view, kind, n, head, position)
            if region.shape == where_shape(self.finds[target], where) and self.same(
                region, self.finds[target][where]
            ):
                yield target, where, region

    @staticmethod
    def region(view, kind: str, n: int, head: int, position: int):
        if kind == "whole":
            return view[:, :n, :], (slice(None), slice(None), slice(None))
        if kind == "head":
            return view[:n], (head, slice(None), slice(None))
        if kind == "position":
            return view, (slice(None), position, slice(None))
        return view, (head, position, slice(None))

    def same(self, region, target) -> bool:
        import numpy as np

        with np.errstate(all="ignore"):
            return bool(np.all(np.abs(region - target) <= self.atol + RTOL * np.abs(target)))


def where_shape(target, where) -> tuple:
    return target[where].shape
