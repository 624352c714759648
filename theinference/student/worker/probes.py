"""The cache-use probes, inside the student's process: what a check asks to alter or measure
during one adapter call (see curriculum/checks). Part of the worker: imports nothing of the
grader."""

import inspect
import os
import sys


class Probe:
    """No probe: nothing altered. (CPU time is measured by the grader, from outside.)"""

    def remove(self) -> None:
        pass

    def report(self):
        return None


class ZeroCacheAfterPrefill(Probe):
    """After each call of the student's prefill (any function named `prefill` in a module of
    the course, whatever name the adapter imports it under), zero in place every float array
    reachable from its cache argument, whatever the layout (mc.layers[l].k, a preallocated
    buffer, K/V kept per head, a private array behind a `.k` property). A decode that still
    gives the right logits cannot have read the cache."""

    def __init__(self, course_dir: str):
        self.patched: list[tuple[object, str, object]] = []
        # prefill_calls: how many times it ran (None: no prefill to watch), which tells a
        # refusal made up front from one made after the work
        self.state = {"applied": False, "reason": "prefill was never called", "zeroed": 0,
                      "prefill_calls": 0}
        for module, attr, fn in functions_named("prefill", course_dir):
            self.patched.append((module, attr, fn))
            setattr(module, attr, self._wrap(fn))
        if not self.patched:
            self.state["reason"] = "src/kvcache.py has no function named prefill"
            self.state["prefill_calls"] = None

    def _wrap(self, original):
        def prefill(prompt_ids, w, *rest, **named):
            self.state["prefill_calls"] += 1
            out = original(prompt_ids, w, *rest, **named)
            zeroed = zero_arrays([*rest, *named.values()], skip=array_ids(w))
            total = self.state["zeroed"] + zeroed
            why = "" if total else "prefill left no K/V values in mc: nothing a decode could read"
            self.state |= {"applied": total > 0, "reason": why, "zeroed": total}
            return out

        return prefill

    def remove(self) -> None:
        for module, attr, fn in self.patched:
            setattr(module, attr, fn)

    def report(self):
        return self.state


def install_probe(probe, course_dir: str) -> Probe:
    kind = probe.get("kind") if isinstance(probe, dict) else None
    if kind == "zero_cache_after_prefill":
        return ZeroCacheAfterPrefill(course_dir)
    return Probe()


def functions_named(name: str, course_dir: str) -> list[tuple[object, str, object]]:
    """(module, attribute, function) for every function called `name` (by its own name, so
    aliases count) held by a module loaded from the course directory."""
    root = os.path.realpath(course_dir) + os.sep
    found = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if not os.path.realpath(path).startswith(root):
            continue
        for attr, value in list(vars(module).items()):
            if inspect.isfunction(value) and value.__name__ == name:
                found.append((module, attr, value))
    return found


def array_ids(root) -> set[int]:
    """ids of the arrays reachable from the weights, which the probe must never touch."""
    seen: set[int] = set()
    arrays: list = []
    walk(root, arrays, seen, depth=0)
    return {id(a) for a in arrays}


def zero_arrays(roots: list, skip: set[int]) -> int:
    """Zero, in place, every writeable float array reachable from roots; how many values."""
    arrays: list = []
    seen: set[int] = set()
    for root in roots:
        walk(root, arrays, seen, depth=0)
    zeroed = 0
    for array in arrays:
        if id(array) not in skip and array.dtype.kind == "f" and array.flags.writeable:
            array[...] = 0
            zeroed += array.size
    return zeroed


def walk(obj, arrays: list, seen: set[int], depth: int) -> None:
    import numpy as np

    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        arrays.append(obj.base if isinstance(obj.base, np.ndarray) else obj)
        return
    if isinstance(obj, (str, bytes, int, float, type)) or callable(obj):
        return
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    else:
        slots = [n for n in getattr(type(obj), "__slots__", ()) if hasattr(obj, n)]
        children = [*getattr(obj, "__dict__", {}).values(), *(getattr(obj, n) for n in slots)]
    for child in children:
        walk(child, arrays, seen, depth + 1)
