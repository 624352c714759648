"""The cache-use hook, inside the student's process (part of the worker: imports nothing of the
grader): the grader names a function (`prefill`, `attn_step`) and every function of that name
in a module loaded from the course is wrapped for the call.

When it first returns, the wrapper tells the grader on the reply pipe and waits on the request
pipe for its answer: the swap's sizes (swap.py then sends what the cache holds, the grader finds
the K/V in it by content whatever the layout and answers with the rows to write), or nothing,
with the call after which to ask again (none: a graded call). Until that first return a probe
looks like any other call; after it, nothing the student's code learns helps it: only reading
the cache gives the answer over K/V that no token sequence has. Every call of a stage with a
hook installs it, so a graded call looks the same.
"""

import inspect
import os
import sys
import threading

if __package__:
    from . import protocol
else:  # loaded by its path, as the worker loads its parts (worker.sibling): protocol first
    protocol = sys.modules["_theinference_worker_protocol"]


class NoHook:
    """No hook asked for: nothing wrapped, nothing reported."""

    def remove(self) -> None:
        pass

    def report(self):
        return None


def install_hook(name, course_dir: str, exchange, prepare, watch=None):
    """The hook the request names (NoHook when none): with `watch` "returns", a ReturnWatch
    (no name needed), else the functions of that name wrapped; `prepare(plan, exchange)` is
    swap.py's Target, whose `swap(roots, weights)` sends what the roots hold to the grader
    and writes what it answers."""
    if not isinstance(name, str) or not name.isidentifier():
        return NoHook()
    if watch == protocol.WATCH_RETURNS:
        return ReturnWatch(name, course_dir, exchange, prepare)
    return Hook(name, course_dir, exchange, prepare)


DEPTH = 4  # course functions between the adapter and a return that is a moment, at most
WRAPPERS = 3  # library frames passed over between two of them (a decorator's)
NO_MORE = "no cache was found in as many returns after the first as the grader looks at"


class ReturnWatch:
    """The swap after the prompt's prefill, wherever it happens and whatever it is called.

    Every return into the adapter, or into a function of the course up to DEPTH calls below it,
    is a moment the prompt's K/V may all be in memory (a prefill, by any name, or a library model
    called with a cache, has just returned); so is every return of a course function named
    `name` (`prefill`), wherever it is called from. At the first such moment the watch asks the
    grader for the swap; from then on, at each moment, it looks for every K/V row in what the
    returning function was given and returned and in its caller's variables, and swaps them as
    soon as all are there: before anything after the prefill reads them. A sys.settrace
    tracer on the adapter's thread sees those returns; nothing of the student's is wrapped.
    """

    def __init__(self, name: str, course_dir: str, exchange, prepare):
        self.name, self.exchange, self.prepare = name, exchange, prepare
        self.course = CourseModules(course_dir)
        self.state = {
            "hook": name,
            "calls": 0,
            "entered": 0,
            "found": 0,
            "swap": None,
            "watch": protocol.WATCH_RETURNS,
            "moments": 0,
        }
        self.target = None  # the swap, decoded once the grader has sent it
        self.last = None  # the last moment looked at, where the plan bounds them
        self.done = False
        self.adapter = None  # the adapter's frame, once it is called
        self.outer = sys._getframe(2)  # the worker frame that calls the adapter
        self.course_code: dict = {}  # code object -> whether it is the course's
        self.state["found"] = len(functions_named(name, self.course))
        sys.settrace(self.on_call)

    def in_course(self, code) -> bool:
        known = self.course_code.get(code)
        if known is None:
            known = self.course.holds(code.co_filename)
            self.course_code[code] = known
        return known

    def on_call(self, frame, event, arg):
        if event != "call" or self.done:
            return None
        caller = frame.f_back
        if self.adapter is None:
            if caller is self.outer:
                self.adapter = frame
            return None
        named = frame.f_code.co_name == self.name and self.in_course(frame.f_code)
        if named:
            self.state["entered"] += 1
        if not (named or self.watched(caller, self.in_course(frame.f_code))):
            return None
        frame.f_trace_lines = False
        return self.on_return if not named else self.on_named_return

    def watched(self, caller, own: bool) -> bool:
        """Whether a return into `caller` is a moment: any return into the adapter or a course
        function it called (a library model's included); deeper, up to DEPTH calls below the
        adapter through course functions, a course function's own return (`own`: not the many
        of a library's helpers inside a course function). Never inside a function named `name`
        (there the K/V are half built; its own return is a moment)."""
        for depth in range(DEPTH):
            if caller is None:
                return False
            if caller is self.adapter:
                return True
            if depth >= 1 and not own:
                return False
            if caller.f_code.co_name == self.name or not self.in_course(caller.f_code):
                return False
            caller = self.above(caller)
        return caller is self.adapter

    def above(self, frame):
        """The frame's caller, past up to WRAPPERS library frames: a decorator's (such as
        torch.no_grad) between the adapter and a course function, or between two."""
        caller = frame.f_back
        for _ in range(WRAPPERS):
            if caller is None or caller is self.adapter or self.in_course(caller.f_code):
                return caller
            caller = caller.f_back
        return caller

    def on_named_return(self, frame, event, arg):
        if event != "return":
            return self.on_named_return  # an exception raised and caught inside: keep watching
        self.state["calls"] += 1
        return self.on_return(frame, event, arg)

    def on_return(self, frame, event, arg):
        if event != "return":
            return self.on_return  # an exception raised and caught inside: keep watching
        if self.done:
            return None
        self.state["moments"] += 1
        if self.target is None:
            header = {"outcome": "hooked", "probe": {"call": self.state["moments"]}}
            answer, _ = self.exchange(header)
            if not isinstance(answer.get("swap"), dict):
                self.stop()  # a call the grader does not swap
                return None
            self.target = guarded(self.prepare, answer["swap"], self.exchange)
            if isinstance(self.target, dict):  # the plan could not be read: said, not raised
                self.state["swap"] = self.target
                self.stop()
                return None
            moments = answer["swap"].get("moments")
            self.last = self.state["moments"] + moments if isinstance(moments, int) else None
        if self.last is not None and self.state["moments"] > self.last:
            self.state["swap"] = {"applied": False, "stop": True, "reason": NO_MORE}
            self.stop()
            return None
        caller = frame.f_back
        roots = [arg, dict(frame.f_locals), dict(caller.f_locals) if caller else {}]
        kept, classes = self.course.state()
        self.state["swap"] = guarded(self.target.swap, roots + kept, None, classes)
        if self.state["swap"].get("applied") or self.state["swap"].get("stop"):
            self.stop()  # swapped, or the grader looks no more
        return None

    def stop(self) -> None:
        self.done = True
        sys.settrace(None)

    def remove(self) -> None:
        self.stop()

    def report(self) -> dict:
        return dict(self.state)


class Hook:
    """Every function named `name` in the course's modules, wrapped (see the module's text).
    `exchange(header, blobs) -> (answer, blobs)` talks to the grader; `prepare(plan, exchange)`
    is the swap it answers with, whose `swap(roots, weights)` writes the K/V."""

    def __init__(self, name: str, course_dir: str, exchange, prepare):
        self.name, self.exchange, self.prepare = name, exchange, prepare
        self.lock = threading.RLock()
        self.patched = []
        # entered: calls begun, returned or not, which tells a refusal made up front from one
        # made after the work had begun (a guard met inside prefill included)
        self.state = {"hook": name, "calls": 0, "entered": 0, "found": 0, "swap": None}
        self.next_word: int | None = 1  # the call after which to tell the grader next
        self.course = CourseModules(course_dir)
        for module, attr, fn in functions_named(name, self.course):
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
                answer, _ = self.exchange(header)
                following = answer.get("next")
                self.next_word = following if isinstance(following, int) else None
                if isinstance(answer.get("swap"), dict):
                    roots, weights = cache_arguments(original, args, named)
                    kept, classes = self.course.state()
                    target = guarded(self.prepare, answer["swap"], self.exchange)
                    self.state["swap"] = (target if isinstance(target, dict)
                                          else guarded(target.swap, roots + kept, weights,
                                                       classes))
            return out

        hooked.__name__ = original.__name__
        hooked.__qualname__ = original.__qualname__
        return hooked

    def remove(self) -> None:
        for module, attr, fn in self.patched:
            setattr(module, attr, fn)

    def report(self) -> dict:
        return dict(self.state)


def guarded(step, *args):
    """A step of the swap (decoding the plan, a search), whose failure is reported as the
    swap's, never raised into the student's code (where it would read as their error)."""
    try:
        return step(*args)
    except Exception as exc:  # noqa: BLE001
        return {"applied": False, "reason": f"the grader's search failed: {exc!r}"}


class CourseModules:
    """The modules loaded from the course: their globals (a cache kept at module level) and
    their own classes (one kept in class attributes) are where a cache may live too."""

    def __init__(self, course_dir: str):
        self.root = os.path.realpath(course_dir) + os.sep
        self.known: dict = {}  # module name -> whether it was loaded from the course

    def holds(self, path: str) -> bool:
        """Whether a file lies in the course directory."""
        return bool(path) and os.path.realpath(path).startswith(self.root)

    def modules(self) -> list:
        """The modules loaded from the course, now."""
        found = []
        for name, module in list(sys.modules.items()):
            known = self.known.get(name)
            if known is None:
                known = self.known[name] = self.holds(getattr(module, "__file__", None) or "")
            if known:
                found.append(module)
        return found

    def state(self) -> tuple[list, frozenset]:
        """(each course module's globals, the ids of the classes they define)."""
        spaces, classes = [], set()
        for module in self.modules():
            space = vars(module)
            spaces.append(space)
            classes |= {id(v) for v in list(space.values())
                        if isinstance(v, type) and v.__module__ == module.__name__}
        return spaces, frozenset(classes)


def functions_named(name: str, course: CourseModules) -> list:
    """(module, attribute, function) for every function called `name` (by its own name, so
    aliases count) held by a module loaded from the course directory."""
    found = []
    for module in course.modules():
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
