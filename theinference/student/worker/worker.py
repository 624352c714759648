"""Runs inside the student's process: imports their tests/adapters.py and calls what it is asked.

Started as a plain script (`python -P worker.py ...`), so it imports nothing of the grader: no
oracle, no rendering. It reads requests from one private pipe and writes replies to another;
stdout and stderr belong to the student. A reply carries only data (JSON plus raw array bytes,
never pickle), and the grader judges it: printing or writing a forged "passed" changes nothing.
"""

import inspect
import json
import os
import resource
import struct
import sys
import traceback

MAX_ITEMS = 4096  # items described per list when a return value is not one numeric array


def main() -> None:
    req_fd, resp_fd, course_dir, memory_bytes = (*map(int, sys.argv[1:3]), *sys.argv[3:5])
    limit_memory(int(memory_bytes))
    os.chdir(course_dir)
    sys.path.insert(0, course_dir)
    requests = os.fdopen(req_fd, "rb")
    replies = os.fdopen(resp_fd, "wb")
    import numpy  # noqa: F401  (the worker's own start-up, paid before the student's code)

    write_message(replies, {"outcome": "ready"}, [])
    adapters, import_failure = import_adapters(course_dir)
    while (request := read_message(requests)) is not None:
        if import_failure is not None:
            reply = import_failure
        else:
            reply = call_adapter(adapters, request, course_dir)
        flush_student_output()
        write_message(replies, *encode_reply(reply))


MEMORY_LIMIT = 0  # bytes, set at start-up


def limit_memory(limit: int) -> None:
    # RLIMIT_DATA counts heap and anonymous mappings but not the memory-mapped weights or
    # address space reserved by libraries such as PyTorch, so honest solutions never meet it
    global MEMORY_LIMIT
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        MEMORY_LIMIT = limit


def import_adapters(course_dir: str):
    try:
        import tests.adapters as adapters  # the student's module, from the course directory
    except BaseException as exc:  # noqa: BLE001 (SyntaxError, ImportError, SystemExit, ...)
        return None, {
            "outcome": "import_error",
            "message": f"importing tests/adapters.py failed: {describe_exception(exc)}",
            "traceback": student_traceback(exc, course_dir),
        }
    return adapters, None


def call_adapter(adapters, request: dict, course_dir: str) -> dict:
    name, args = request["adapter"], request["args"]
    fn = getattr(adapters, name, None)
    if not callable(fn):
        return {"outcome": "missing", "message": f"tests/adapters.py has no function {name}()"}
    try:
        inspect.signature(fn).bind(*args)
    except TypeError as exc:
        return {
            "outcome": "signature",
            "message": f"{name}{signature_of(fn)} cannot take {len(args)} argument(s): {exc}",
        }
    except ValueError:
        pass  # builtins without a signature: just call them
    probe = install_probe(request.get("probe"), course_dir)
    try:
        value = fn(*args)
    except NotImplementedError as exc:
        return {"outcome": "todo", "message": str(exc) or f"{name} is not implemented yet"}
    except BaseException as exc:  # noqa: BLE001 (the student's SystemExit is theirs, not ours)
        return {
            "outcome": "raised",
            "exception": type(exc).__name__,
            "message": describe_exception(exc),
            "traceback": student_traceback(exc, course_dir),
            "probe": probe.report(),  # a refusal's: did the work start before it?
        }
    finally:
        probe.remove()
    # a baseline call's value is not wanted: only its CPU time, which the grader reads itself
    value = None if request.get("discard") else value
    return {"outcome": "returned", "value": value, "probe": probe.report()}


# --- the cache-use probes ------------------------------------------------------------------


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


def signature_of(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def describe_exception(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"the code called sys.exit({exc.code!r})"
    if isinstance(exc, KeyboardInterrupt):
        return "the code raised KeyboardInterrupt"
    if isinstance(exc, MemoryError):
        limit = f"{MEMORY_LIMIT / 2**30:g} GiB" if MEMORY_LIMIT else "none"
        return f"MemoryError: the code ran out of memory (the grader's limit: {limit})"
    text = str(exc)
    if (hint := suggestion(exc)) and "Did you mean" not in text:
        text += f". Did you mean: '{hint}'?"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def student_traceback(exc: BaseException, course_dir: str) -> str:
    """The traceback trimmed to frames in the course directory, paths made relative to it, each
    frame once, ending with Python's own message and its "Did you mean" suggestion."""
    root = os.path.realpath(course_dir) + os.sep
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if os.path.realpath(f.filename).startswith(root)
    ]
    lines = ["Traceback (your code, most recent call last):\n"] if frames else []
    for frame in frames:
        frame.filename = os.path.relpath(os.path.realpath(frame.filename), root)
    lines += traceback.format_list(frames)
    shown = traceback.TracebackException.from_exception(exc)
    if isinstance(exc, SyntaxError) and shown.filename:  # its own "File ..." line, shown once
        shown.filename = os.path.relpath(os.path.realpath(shown.filename), root)
    last = list(shown.format_exception_only())
    if last and (hint := suggestion(exc)) and "Did you mean" not in last[-1]:
        last[-1] = last[-1].rstrip("\n") + f". Did you mean: '{hint}'?\n"
    return "".join(lines + last)


def suggestion(exc: BaseException) -> str | None:
    """Python 3.12 puts "Did you mean" into the traceback module's text; 3.11 prints it only
    from the interpreter's own hook. The same idea: the closest name that exists."""
    import difflib

    missing = getattr(exc, "name", None)
    if not isinstance(missing, str) or not isinstance(exc, (NameError, AttributeError)):
        return None
    if isinstance(exc, AttributeError):
        try:
            known = dir(exc.obj)
        except Exception:  # noqa: BLE001 (an object whose __dir__ raises)
            return None
    else:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        frame = tb.tb_frame if tb is not None else None
        known = [*frame.f_locals, *frame.f_globals, *dir(__builtins__)] if frame else []
    close = difflib.get_close_matches(missing, [k for k in known if k != missing], n=1)
    return close[0] if close else None


def flush_student_output() -> None:
    # the grader reads the reply only after this, so the call's prints arrive before it
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (the student may have replaced or closed them)
            pass


# --- encoding a reply: JSON describing the value, plus the raw bytes of its arrays -----------


def encode_reply(reply: dict) -> tuple[dict, list[bytes]]:
    blobs: list[bytes] = []
    if reply["outcome"] == "returned":
        reply = {**reply, "value": describe(reply["value"], blobs, depth=0)}
    return reply, blobs


def describe(value, blobs: list[bytes], depth: int) -> dict:
    """A JSON-safe description of what the adapter returned; numeric arrays travel as bytes."""
    import numpy as np

    if value is None:
        return {"kind": "none"}
    if isinstance(value, (str, bytes, dict, set)):
        return {"kind": "other", "type": type(value).__name__}
    try:
        array = np.asarray(to_numpy(value))
    except Exception:  # noqa: BLE001 (ragged lists, exotic objects)
        array = None
    if array is not None and array.dtype.kind in "biufc":
        blobs.append(np.ascontiguousarray(array).tobytes())
        return {
            "kind": "array",
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "blob": len(blobs) - 1,
            "from": type(value).__name__,
        }
    if isinstance(value, (list, tuple)) and depth < 4:
        # e.g. per-layer (k, v) pairs whose shapes differ: describe item by item
        items = [describe(v, blobs, depth + 1) for v in value[:MAX_ITEMS]]
        return {"kind": "seq", "items": items, "length": len(value)}
    if array is not None:
        return {"kind": "other", "type": f"array of dtype {array.dtype}", "shape": array.shape}
    return {"kind": "other", "type": type(value).__name__}


def to_numpy(value):
    # PyTorch tensors (and similar) that still track gradients or live elsewhere
    for method in ("detach", "cpu"):
        if hasattr(value, method) and hasattr(value, "numpy"):
            value = getattr(value, method)()
    return value


# --- framing: 8-byte length, 4-byte JSON length, JSON, then the blobs back to back ----------


def read_message(stream):
    prefix = stream.read(8)
    if len(prefix) < 8:
        return None
    (size,) = struct.unpack("<Q", prefix)
    return json.loads(stream.read(size))


def write_message(stream, header: dict, blobs: list[bytes]) -> None:
    header = {**header, "blob_sizes": [len(b) for b in blobs]}
    text = json.dumps(header, default=str).encode()
    stream.write(struct.pack("<QI", 4 + len(text) + sum(map(len, blobs)), len(text)))
    stream.write(text)
    for blob in blobs:
        stream.write(blob)
    stream.flush()


if __name__ == "__main__":
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the student's code must not wait on input)
    main()
