"""Runs inside the student's process: imports their tests/adapters.py and calls what it is asked.

Started as a plain script (`python -P worker.py ...`), so it imports nothing of the grader: no
oracle, no rendering; its own parts (the cache-use hook and swap, the student's tracebacks,
the reply encoding) are the other modules of this folder, which the sandbox binds whole. It reads
requests from one private pipe and writes replies to another;
stdout and stderr belong to the student. A reply carries only data (JSON plus raw array bytes,
never pickle), and the grader judges it: printing or writing a forged "passed" changes nothing.
"""

import importlib.util
import inspect
import os
import resource
import sys

# started without site processing (-S: the calibration and a measured call's worker, so that
# no .pth file runs in them), the grader names the folders to import from (launch.py)
if sys.flags.no_site:
    sys.path += [p for p in sys._xoptions.get("theinference_path", "").split(os.pathsep) if p]


def sibling(name: str):
    """A module of this folder, loaded by its path under a name no student module has (the
    worker runs as a plain script with -P: its folder is not on sys.path, and never will be)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_theinference_worker_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


protocol = sibling("protocol")  # first: the other parts read it
probes = sibling("probes")
swap = sibling("swap")
tracebacks = sibling("tracebacks")
wire = sibling("wire")
describe_exception, student_traceback = tracebacks.describe_exception, tracebacks.student_traceback
read_message, write_message, encode_reply = wire.read_message, wire.write_message, wire.encode_reply
read_frame, read_request = wire.read_frame, wire.read_request


def main() -> None:
    # the hooks' names (sys.argv[6], launch.py's) are the Node worker's: this one wraps
    # whatever function a request names
    req_fd, resp_fd, course_dir, memory_bytes, mode = (*map(int, sys.argv[1:3]), *sys.argv[3:6])
    if mode == "guarded":  # first: nothing of the student's may run before the filter
        sibling("guard").install()  # the grader reads /proc to know it is on
    limit_memory(int(memory_bytes))
    not_dumpable()
    calibrating = mode == "calibrate"
    # the calibration never sees the course: a numpy.py (or any module) laid beside the
    # student's files would otherwise run in it and slow the rate the floors are drawn from
    os.chdir("/" if calibrating else course_dir)
    requests = os.fdopen(req_fd, "rb")
    replies = os.fdopen(resp_fd, "wb")
    import numpy  # noqa: F401  (the worker's own start-up, paid before the student's code)

    write_message(replies, {"outcome": "ready"}, [])
    # the grader places this process where its CPU is accounted (cgroups.py), then says go:
    # nothing of the course is importable before that
    if read_message(requests) is None:
        return
    if not calibrating:
        sys.path.insert(0, course_dir)
        adapters, import_failure = import_adapters(course_dir)
        flush_student_output()  # what the import printed, before the grader's next look
    write_message(replies, {"outcome": "loaded"}, [])
    if calibrating:
        return calibrate(requests, replies)

    def exchange(header: dict, blobs=()):  # a hook's word to the grader mid-call, its answer
        write_message(replies, header, list(blobs))
        return read_frame(requests)

    while (request := read_request(requests)) is not None:
        if import_failure is not None:
            reply = import_failure
        else:
            reply = call_adapter(adapters, request, course_dir, exchange)
        flush_student_output()
        write_message(replies, *encode_reply(reply))


def limit_memory(limit: int) -> None:
    # RLIMIT_DATA counts heap and anonymous mappings but not the memory-mapped weights or
    # address space reserved by libraries such as PyTorch, so honest solutions never meet it
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        tracebacks.MEMORY_LIMIT = limit  # named in a MemoryError's message


PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4


def not_dumpable() -> None:
    # before the student's code loads: another process of the same uid (one it left behind,
    # or a later submission's) can then neither ptrace this one nor take its pipes from /proc;
    # and should the grader die without stopping it (SIGKILL), the kernel kills the worker
    import ctypes
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux
    if os.getppid() != parent:  # the grader died before the signal was asked for
        os._exit(1)


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


def call_adapter(adapters, request: dict, course_dir: str, exchange) -> dict:
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
    hook, watch = request.get("hook"), request.get("watch")
    probe = probes.install_hook(hook, course_dir, exchange, swap.Target, watch)
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
    return {"outcome": "returned", "value": value, "probe": probe.report()}


def calibrate(requests, replies) -> None:
    """The calibration mode: no student code is loaded; each request asks for a fixed float32
    matrix product [m, k] @ [k, n] repeated, whose CPU time the grader reads from outside."""
    import numpy as np

    while (request := read_request(requests)) is not None:
        m, k, n, repeat = (int(x) for x in request["args"])
        a = np.full((m, k), 0.5, dtype=np.float32)
        b = np.full((k, n), 0.25, dtype=np.float32)
        for _ in range(repeat):
            a @ b
        write_message(replies, {"outcome": "returned", "value": {"kind": "none"}}, [])


def signature_of(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def flush_student_output() -> None:
    # the grader reads the reply only after this, so the call's prints arrive before it
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (the student may have replaced or closed them)
            pass


if __name__ == "__main__":
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the student's code must not wait on input)
    main()
