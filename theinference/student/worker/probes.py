"""The cache-use hook, inside the student's process (part of the worker: imports nothing of the
grader): the grader names a function (`prefill`, `attn_step`) and every function of that name
in a module loaded from the course is wrapped for the call.

When it first returns, the wrapper tells the grader on the reply pipe and waits on the request
pipe for its answer: the K/V the cache should now hold (written by swap.py, which finds the K/V
by content whatever the layout), or nothing, with the call after which to ask again (none: a
graded call). Until that first return a probe looks like any other call; after it, nothing the
student's code learns helps it: only reading the cache gives the answer over K/V that no token
sequence has. Every call of a stage with a hook installs it, so a graded call looks the same.
"""

import inspect
import os
import sys
import threading


class NoHook:
    """No hook asked for: nothing wrapped, nothing reported."""

    def remove(self) -> None:
        pass

    def report(self):
        return None


def install_hook(name, course_dir: str, exchange, swap_cache):
    """The hook the request names (NoHook when none); `swap_cache` is swap.py's."""
    if not isinstance(name, str) or not name.isidentifier():
        return NoHook()
    return Hook(name, course_dir, exchange, swap_cache)


class Hook:
    """Every function named `name` in the course's modules, wrapped (see the module's text).
    `exchange(header) -> (answer, blobs)` talks to the grader; `swap_cache(roots, weights,
    plan, blobs)` writes the K/V it answers with."""

    def __init__(self, name: str, course_dir: str, exchange, swap_cache):
        self.name, self.exchange, self.swap_cache = name, exchange, swap_cache
        self.lock = threading.RLock()
        self.patched = []
        # entered: calls begun, returned or not, which tells a refusal made up front from one
        # made after the work had begun (a guard met inside prefill included)
        self.state = {"hook": name, "calls": 0, "entered": 0, "found": 0, "swap": None}
        self.next_word: int | None = 1  # the call after which to tell the grader next
        for module, attr, fn in functions_named(name, course_dir):
            self.patched.append((module, attr, fn))
            setattr(module, attr, self._wrap(fn))
        self.state["found"] = len(self.patched)

    def _wrap(self, original):
        def hooked(*args, **named):
            with self.lock:
                self.state["entered"] += 1
            out = original(*args, **named)
            with self.lock:
                self.state["calls"] += 1
                if self.next_word is None or self.state["calls"] < self.next_word:
                    return out  # the grader's answer said not to ask again before then
                header = {"outcome": "hooked", "probe": {"call": self.state["calls"]}}
                answer, blobs = self.exchange(header)
                following = answer.get("next")
                self.next_word = following if isinstance(following, int) else None
                if isinstance(answer.get("swap"), dict):
                    roots, weights = cache_arguments(original, args, named)
                    self.state["swap"] = self.swap_cache(roots, weights, answer["swap"], blobs)
            return out

        hooked.__name__ = original.__name__
        hooked.__qualname__ = original.__qualname__
        return hooked

    def remove(self) -> None:
        for module, attr, fn in self.patched:
            setattr(module, attr, fn)

    def report(self) -> dict:
        return dict(self.state)


def functions_named(name: str, course_dir: str) -> list:
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


def cache_arguments(fn, args: tuple, named: dict) -> tuple[list, object]:
    """(the arguments that may hold the cache, the weights): every argument after the first
    two, which are the input and the weights in every hooked function of the course."""
    try:
        bound = list(inspect.signature(fn).bind(*args, **named).arguments.values())
    except (TypeError, ValueError):
        bound = [*args, *named.values()]
    return bound[2:], (bound[1] if len(bound) > 1 else None)
