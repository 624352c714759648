"""The watcher as a student runs it: a real process, real file edits, its real output."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import make_course, reference_text
from theinference.watch import changed_files, is_watched, snapshot

STAGE = "single-step-attention"
RUN_DONE = "watching for changes"


class Watcher:
    """`theinference test --watch` in a subprocess, its stdout read line by line."""

    def __init__(self, course: Path, *extra: str):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "theinference",
                "test",
                "--watch",
                "-C",
                str(course),
                "-s",
                STAGE,
                "--timeout",
                "3",
                *extra,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def until(self, text: str, timeout: float = 240) -> list[str]:
        """Lines up to and including the first that contains text."""
        got, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            got.append(line)
            self.seen.append(line)
            if text in line:
                return got
        raise AssertionError(f"no {text!r} within {timeout} s; output:\n{''.join(self.seen)}")

    def quiet_for(self, seconds: float) -> list[str]:
        got, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                got.append(self.lines.get(timeout=0.1))
            except queue.Empty:
                pass
        self.seen += got
        return got

    def send(self, text: str):
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def watcher_for(weights):
    made = []

    def start(course: Path, *extra: str) -> Watcher:
        made.append(Watcher(course, *extra))
        return made[-1]

    yield start
    for w in made:
        w.close()


def save(path: Path, text: str):
    path.write_text(text)


def test_reruns_on_an_edit_and_ignores_no_op_saves_and_temp_files(tmp_path, watcher_for):
    course = make_course(tmp_path / "c")
    w = watcher_for(course)
    first = w.until(RUN_DONE)
    assert any("TODO" in line for line in first)
    kvcache = course / "src" / "kvcache.py"
    save(kvcache, kvcache.read_text())  # identical content
    save(course / "src" / ".kvcache.py.swp", "swap")
    save(course / "src" / "kvcache.py~", "backup")
    (course / "src" / "__pycache__").mkdir(exist_ok=True)
    save(course / "src" / "__pycache__" / "x.pyc", "bytecode")
    assert not [line for line in w.quiet_for(1.5) if "changed" in line]
    save(kvcache, reference_text())
    rerun = w.until(RUN_DONE)
    assert any("src/kvcache.py changed" in line for line in rerun)
    assert any("PASSED" in line for line in rerun)


def test_a_save_during_a_run_restarts_it(tmp_path, watcher_for):
    slow = reference_text().replace(
        "def layer_attn_incremental(X, w, layer):",
        "def layer_attn_incremental(X, w, layer):\n    import time\n    time.sleep(30)",
    )
    course = make_course(tmp_path / "c", slow)
    w = watcher_for(course, "--timeout", "120")
    w.until("stages:")  # the first run has started and is sleeping in the student's code
    time.sleep(0.5)
    save(course / "src" / "kvcache.py", reference_text())
    lines = w.until(RUN_DONE, timeout=240)
    text = "".join(lines)
    assert "run stopped: src/kvcache.py changed" in text
    assert "PASSED" in text


def test_survives_hangs_crashes_and_exits_then_quits_on_ctrl_c(tmp_path, watcher_for):
    course = make_course(tmp_path / "c")
    w = watcher_for(course)
    w.until(RUN_DONE)
    adapters = course / "tests" / "adapters.py"
    original = adapters.read_text()
    for body, expected in [
        ("while True: pass", "timed out after 3 s"),
        ("import os; os._exit(3)", "exited with code 3"),
        ("raise SystemExit(0)", "sys.exit(0)"),
        ("def broken(:", "SyntaxError"),
    ]:
        save(
            adapters,
            original.replace(
                '    """single-step-attention: layer 0\'s',
                f"    {body}\n" + '    """single-step-attention: layer 0\'s',
            )
            if "def broken" not in body
            else original + "\n" + body + "\n",
        )
        out = "".join(w.until(RUN_DONE))
        assert expected in out, out
    w.proc.send_signal(signal.SIGINT)
    assert w.proc.wait(timeout=15) == 130
    rest = "".join(w.quiet_for(0.5))
    assert "Traceback (most recent call last)" not in "".join(w.seen) + rest  # none of ours


def test_keys_rerun_run_all_and_quit(tmp_path, watcher_for):
    course = make_course(tmp_path / "c")
    w = watcher_for(course)
    w.until(RUN_DONE)
    w.send("\n")
    assert any("rerun" in line for line in w.until(RUN_DONE))
    w.send("a\n")
    out = "".join(w.until(RUN_DONE))
    assert "all stages" in out and "full-decode-step" in out
    w.send("q\n")
    assert w.proc.wait(timeout=15) == 1  # the last run did not pass


def test_polling_mode_sees_edits(tmp_path, watcher_for):
    course = make_course(tmp_path / "c")
    w = watcher_for(course, "--poll")
    w.until(RUN_DONE)
    save(course / "src" / "kvcache.py", reference_text())
    assert any("PASSED" in line for line in w.until(RUN_DONE))


def test_watched_files_rule():
    assert is_watched(Path("src/kvcache.py")) and is_watched(Path("theinference.toml"))
    for rel in (
        "src/.kvcache.py.swp",
        "src/kvcache.py~",
        "src/__pycache__/k.py",
        ".theinference/progress.json",
        ".venv/lib/x.py",
        "notes.txt",
        "src/#k.py#",
    ):
        assert not is_watched(Path(rel)), rel


def test_snapshot_sees_content_not_mtime(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    before = snapshot(tmp_path)
    (tmp_path / "a.py").write_text("x = 1\n")
    assert changed_files(before, snapshot(tmp_path)) == []
    (tmp_path / "a.py").write_text("x = 2\n")
    assert changed_files(before, snapshot(tmp_path)) == ["a.py"]
