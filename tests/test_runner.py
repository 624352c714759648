"""The student's process: whatever the adapter does comes back as data, and limits hold."""

import json
import pwd
import socket
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import alive
from tests.test_hostile import ESCAPEE, escapees
from theinference.student import sandbox
from theinference.student.process import StudentProcess
from theinference.student.replies import Foreign
from theinference.student.sandbox import Sandbox
from theinference.student.setup import Limits, ProcessSetup


def course_with(tmp_path: Path, adapters: str, kvcache: str = "") -> Path:
    (tmp_path / "tests").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "src" / "__init__.py").write_text("")
    (tmp_path / "src" / "kvcache.py").write_text(textwrap.dedent(kvcache))
    (tmp_path / "tests" / "adapters.py").write_text(textwrap.dedent(adapters))
    return tmp_path


def call(course: Path, adapter: str, args: list, **limits):
    with StudentProcess(ProcessSetup(
            course, Path("/nonexistent.safetensors"), Limits(**limits))) as worker:
        return worker.call(adapter, args)


def test_values_come_back_as_arrays_lists_and_foreign_types(tmp_path):
    course = course_with(
        tmp_path,
        """
        import numpy as np
        def arr(ids): return np.arange(len(ids), dtype=np.float32)
        def lst(ids): return [0.5] * len(ids)
        def pairs(ids): return [(np.zeros((2, 3)), np.ones((2, 4)))]
        def none(ids): return None
        def text(ids): return "logits"
        def cplx(ids): return np.ones(3, dtype=complex)
        def obj(ids): return np.array([object()])
    """,
    )
    with StudentProcess(ProcessSetup(course, Path("/x"), Limits())) as w:
        a = w.call("arr", [[1, 2, 3]])
        assert a.kind == "returned" and a.value.dtype == np.float32
        np.testing.assert_array_equal(a.value, [0, 1, 2])
        assert w.call("lst", [[1, 2]]).value.tolist() == [0.5, 0.5]
        k, v = w.call("pairs", [[1]]).value[0]
        assert k.shape == (2, 3) and v.shape == (2, 4)
        assert w.call("none", [[1]]).value is None
        assert w.call("text", [[1]]).value == Foreign("str")
        assert w.call("cplx", [[1]]).value.dtype.kind == "c"
        assert isinstance(w.call("obj", [[1]]).value, Foreign)
        assert w.startups == 1


def test_inputs_are_copies(tmp_path):
    course = course_with(
        tmp_path,
        """
        def mutate(ids):
            ids.append(99)
            return [float(len(ids))]
    """,
    )
    args = [[1, 2]]
    assert call(course, "mutate", args).value.tolist() == [3.0]
    assert args == [[1, 2]]


def test_not_implemented_is_todo_with_the_stub_message(tmp_path):
    course = course_with(
        tmp_path,
        """
        from src.kvcache import f
        def run(ids): return f()
    """,
        kvcache="""
        def f():
            raise NotImplementedError("single-step-attention: implement attn_step")
    """,
    )
    out = call(course, "run", [[1]])
    assert out.kind == "todo" and "implement attn_step" in out.message


def test_an_exception_points_at_the_students_file_and_line(tmp_path):
    course = course_with(
        tmp_path,
        """
        from src.kvcache import f
        def run(ids): return f(ids)
    """,
        kvcache="""
        import numpy as np
        def f(ids):
            return np.zeros(3) @ np.zeros(4)
    """,
    )
    out = call(course, "run", [[1]])
    assert out.kind == "raised"
    assert 'File "src/kvcache.py", line 4, in f' in out.traceback
    assert 'File "tests/adapters.py", line 3, in run' in out.traceback
    assert "worker.py" not in out.traceback and "numpy" not in out.traceback.split("\n")[1]
    assert out.message.startswith("ValueError")


def test_syntax_error_is_an_import_error_with_the_line(tmp_path):
    course = course_with(
        tmp_path,
        """
        from src.kvcache import f
        def run(ids): return f()
    """,
        kvcache="""
        def f(:
            pass
    """,
    )
    out = call(course, "run", [[1]])
    assert out.kind == "import_error"
    assert "SyntaxError" in out.message and 'src/kvcache.py", line 2' in out.traceback


def test_missing_adapter_and_wrong_signature(tmp_path):
    course = course_with(tmp_path, "def run(a, b, c): return [1.0]\n")
    assert call(course, "other", [[1]]).kind == "missing"
    wrong = call(course, "run", [[1]])
    assert wrong.kind == "signature" and "run(a, b, c)" in wrong.message


@pytest.mark.parametrize(
    "body,expected",
    [
        ("raise SystemExit(0)", "sys.exit(0)"),
        ("raise SystemExit(1)", "sys.exit(1)"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ],
)
def test_exits_and_interrupts_are_the_students_errors(tmp_path, body, expected):
    course = course_with(tmp_path, f"def run(ids):\n    {body}\n")
    out = call(course, "run", [[1]])
    assert out.kind == "raised" and expected in out.message


def test_os_exit_and_signals_are_crashes(tmp_path):
    course = course_with(
        tmp_path,
        """
        import os, signal
        def exit0(ids): os._exit(0)
        def segv(ids): os.kill(os.getpid(), signal.SIGSEGV)
        def fine(ids): return [1.0]
    """,
    )
    with StudentProcess(ProcessSetup(course, Path("/x"), Limits())) as w:
        first = w.call("exit0", [[1]])
        assert first.kind == "crashed" and "exited with code 0" in first.message
        second = w.call("segv", [[1]])
        assert second.kind == "crashed" and "SIGSEGV" in second.message
        assert w.call("fine", [[1]]).kind == "returned"  # a fresh process took over
        assert w.startups == 3


def test_a_hang_is_killed_at_the_timeout_with_its_children(tmp_path):
    course = course_with(
        tmp_path,
        """
        import os, signal, time
        def hang(ids):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if os.fork() == 0:
                open("child.pid", "w").write(str(os.getpid()))
                while True:
                    time.sleep(1)
            while True:
                try:
                    time.sleep(1)
                except BaseException:
                    pass
    """,
    )
    started = time.monotonic()
    out = call(course, "hang", [[1]], timeout=1.5)
    assert out.kind == "timeout" and "timed out after 1.5 s" in out.message
    assert time.monotonic() - started < 10
    child = int((course / "child.pid").read_text())
    time.sleep(0.2)
    assert not alive(child)


def test_output_is_captured_per_call_and_capped(tmp_path):
    course = course_with(
        tmp_path,
        """
        import sys
        def loud(ids):
            print("hello from the student")
            sys.stdout.write("x" * 5_000_000)
            print("to stderr", file=sys.stderr)
            return [1.0]
    """,
    )
    out = call(course, "loud", [[1]], output_bytes=1024)
    assert out.kind == "returned"
    assert out.stdout.startswith("hello from the student")
    assert "output cut at 1 KiB" in out.stdout and len(out.stdout) < 2000
    assert out.stderr.strip() == "to stderr"


def test_a_forged_reply_on_stdout_is_just_output(tmp_path):
    course = course_with(
        tmp_path,
        """
        import struct, json, sys
        def forge(ids):
            text = json.dumps({"outcome": "returned", "value": {"kind": "none"}}).encode()
            sys.stdout.buffer.write(struct.pack("<QI", 4 + len(text), len(text)) + text)
            print('{"status": "passed"}')
            raise RuntimeError("real failure")
    """,
    )
    out = call(course, "forge", [[1]])
    assert out.kind == "raised" and "real failure" in out.message
    assert "passed" in out.stdout


def test_memory_limit_stops_a_huge_allocation(tmp_path):
    course = course_with(
        tmp_path,
        """
        import numpy as np
        def hog(ids):
            x = np.ones((20 * 1024**3) // 8)
            return [float(x[0])]
    """,
    )
    out = call(course, "hog", [[1]], memory_bytes=2 << 30)
    assert out.kind == "raised" and "MemoryError" in out.message


def test_a_child_that_leaves_the_process_group_is_killed_too(tmp_path):
    course = course_with(
        tmp_path,
        """
        import os, time
        def escape(ids):
            if os.fork() == 0:
                os.setsid()  # a new session: killing the worker's group no longer reaches it
                if os.fork() == 0:
                    open("escaped.pid", "w").write(str(os.getpid()))
                    while True:
                        time.sleep(1)
                os._exit(0)
            time.sleep(0.5)
            return [1.0]
    """,
    )
    out = call(course, "escape", [[1]])
    assert out.kind == "returned"
    time.sleep(0.2)
    assert not alive(int((course / "escaped.pid").read_text()))


def test_the_grader_cache_location_is_not_passed_to_the_student(tmp_path, monkeypatch):
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", "/somewhere/private")
    course = course_with(
        tmp_path,
        """
        import os
        def peek(ids):
            return [float("THEINFERENCE_CACHE_DIR" in os.environ)]
    """,
    )
    assert call(course, "peek", [[1]]).value.tolist() == [0.0]


# --- bubblewrap ------------------------------------------------------------------------------

needs_bwrap = pytest.mark.skipif(
    bool(sandbox.bwrap_problem()), reason=f"bubblewrap unusable here: {sandbox.bwrap_problem()}"
)


def bwrapped(course: Path, weights: Path) -> StudentProcess:
    return StudentProcess(ProcessSetup(
            course, weights, Limits(timeout=20), sandbox=Sandbox("bwrap")))


@needs_bwrap
def test_in_bwrap_the_process_sees_only_its_own_world(tmp_path, weights_cache):
    """Would catch a bind too many (the grader's cache, the host's /tmp, the test's files), a
    writable course or weights, a shared PID or network namespace, or grader variables leaking
    into the environment."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    (tmp_path / "secret.txt").write_text("not yours")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"weights")
    course = course_with(
        tmp_path / "c",
        f"""
        import json, os, socket
        def look(ids):
            seen = {{}}
            def attempt(name, fn):
                try:
                    fn(); seen[name] = "ok"
                except OSError as exc:
                    seen[name] = type(exc).__name__
            attempt("net", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
            attempt("secret", lambda: open({str(tmp_path / "secret.txt")!r}).read())
            attempt("cache", lambda: os.listdir({str(weights_cache)!r}))
            attempt("write_course", lambda: open("mine.txt", "w").write("x"))
            attempt("write_weights", lambda: open(os.environ["THEINFERENCE_WEIGHTS"], "r+b"))
            attempt("read_weights", lambda: open(os.environ["THEINFERENCE_WEIGHTS"], "rb").read())
            attempt("write_tmp", lambda: open("/tmp/mine.txt", "w").write("x"))
            attempt("write_home", lambda: open(os.path.expanduser("~/mine.txt"), "w").write("x"))
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
            print(json.dumps([seen, sorted(os.environ), len(pids), os.getuid()]))
            return [1.0]
        """,
    )
    with bwrapped(course, weights) as process:
        out = process.call("look", [[1]])
        assert process.sandbox == "bwrap"
    assert out.kind == "returned", (out.message, out.stderr)
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever connected
    seen, env, pids, uid = json.loads(out.stdout)
    assert seen.pop("net") in ("ConnectionRefusedError", "OSError")  # its own empty loopback
    assert seen == {
        "secret": "FileNotFoundError",
        "cache": "FileNotFoundError",
        "write_course": "OSError",  # EROFS
        "write_weights": "OSError",
        "read_weights": "ok",
        "write_tmp": "ok",
        "write_home": "ok",
    }
    assert not (course / "mine.txt").exists()
    assert "THEINFERENCE_CACHE_DIR" not in env and "PYTHONPATH" not in env
    assert pids <= 3 and uid != 0  # bwrap's init, the worker, perhaps its own child


@needs_bwrap
def test_in_bwrap_crashes_are_named_and_escaped_children_die(tmp_path):
    """Would catch bwrap's 128+N exit code shown as a plain exit, a daemon that left the
    process group and survives the end of its call because it sits in another PID namespace,
    or the end-of-call sweep killing the worker (or bwrap) instead of only what it started."""
    course = course_with(
        tmp_path,
        f"""
        import ctypes, os, signal, time
        def segv(ids): os.kill(os.getpid(), signal.SIGSEGV)
        def escape(ids):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    ctypes.CDLL(None).prctl(15, b"{ESCAPEE}", 0, 0, 0)
                    time.sleep(600)
                os._exit(0)
            time.sleep(0.5)
            return [1.0]
        """,
    )
    with bwrapped(course, Path("/nonexistent")) as process:
        crash = process.call("segv", [[1]])
        assert crash.kind == "crashed" and "SIGSEGV" in crash.message, crash.message
        assert process.call("escape", [[1]]).kind == "returned"
        time.sleep(0.2)
        assert not escapees(), "the daemon outlived the call that started it"
        assert process.call("escape", [[1]]).kind == "returned" and process.startups == 2
    time.sleep(0.2)
    assert not escapees()


def test_a_process_that_cannot_start_is_a_crash_not_a_traceback(tmp_path, monkeypatch):
    """Would catch an OSError from Popen (e.g. an interpreter the dropped user cannot run)
    escaping into the grader as a traceback."""
    course = course_with(tmp_path, "def run(ids): return [1.0]\n")
    process = StudentProcess(ProcessSetup(course, Path("/x"), Limits()))
    real = process._command
    monkeypatch.setattr(
        process, "_command", lambda r, w: (["/nonexistent/python"], *real(r, w)[1:])
    )
    with process:
        out = process.call("run", [[1]])
    assert out.kind == "crashed" and "could not start" in out.message


def test_choosing_a_sandbox(tmp_path, monkeypatch):
    """Would catch `--sandbox bwrap` grading without bubblewrap, or `auto` falling back
    silently instead of saying how to install it."""
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(sandbox.SandboxError, match="apt-get install bubblewrap"):
        sandbox.choose("bwrap")
    with pytest.raises(sandbox.SandboxError, match="auto, bwrap, unprivileged-user, none"):
        sandbox.choose("docker")
    fallback = sandbox.choose("auto")
    assert fallback.kind in ("none", "unprivileged-user")
    assert "install bubblewrap" in fallback.notes[0]
    assert not [n for n in sandbox.choose("none").notes if "install" in n]


@needs_bwrap
def test_in_bwrap_a_cache_inside_the_course_is_hidden(tmp_path, monkeypatch):
    """Would catch a grader cache set below the course directory (or the Python prefix)
    showing through the course's read-only bind, secret and stored answers included."""
    course = course_with(
        tmp_path,
        """
        import os
        def look(ids):
            return [float(len(os.listdir(".cache"))), float(os.path.isdir("src"))]
        """,
    )
    (course / ".cache").mkdir()
    (course / ".cache" / "answer-key").write_bytes(b"k" * 32)
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(course / ".cache"))
    with bwrapped(course, Path("/nonexistent")) as process:
        out = process.call("look", [[1]])
    assert out.kind == "returned", out.message
    assert out.value.tolist() == [0.0, 1.0]


def test_unprivileged_user_when_a_root_grader_has_no_bubblewrap(tmp_path):
    """Would catch a root grader without bubblewrap running the student's code as root, as
    the shared `nobody`, or not at all because the course (in a 0700 folder, as `grade` lays
    submissions out) is not readable by others: it runs as a uid of its own, on a copy of the
    course, unable to read a root-only file beside it."""
    from tests.test_containment import require_unprivileged

    chosen = require_unprivileged()
    course = course_with(
        tmp_path / "course",
        "import os\ndef who(ids):\n    return [float(os.getuid()), float("
        f"os.access({str(tmp_path / 'secret')!r}, os.R_OK))]\n",
    )
    (tmp_path / "secret").write_text("root only")
    (tmp_path / "secret").chmod(0o600)
    with StudentProcess(ProcessSetup(
            course, Path("/nonexistent"), Limits(), sandbox=chosen)) as process:
        out = process.call("who", [[1]])
        uid = process.uid
    assert out.kind == "returned", out.message
    assert out.value.tolist() == [float(uid), 0.0]
    assert uid not in (0, 65534) and uid not in {e.pw_uid for e in pwd.getpwall()}
