"""The watcher as a student runs it: a real process, real file edits, its real output."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import make_course, reference_text
from theinference.grading.watching import changed_files, is_watched, snapshot

STAGE = "single-step-attention"
RUN_DONE = "watching for changes"


def default_sigint():
    """Ctrl-C as a terminal delivers it: a suite started as a background job inherits SIGINT
    ignored, and Python then never raises KeyboardInterrupt in the watcher."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
            preexec_fn=default_sigint,
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


# --- what the screen says: error lessons, tracebacks, diagnosis, next step ------------------


def error_case(name: str, traceback: str):
    from theinference.results import CaseResult, Status

    last = traceback.strip().splitlines()[-1]
    return CaseResult(name=name, status=Status.ERROR, message=last, traceback=traceback)


SOFTMAX_CRASH = """Traceback (your code, most recent call last):
  File "src/kvcache.py", line 50, in attend
    a = merge_heads(softmax(scores) @ values)[0]
  File "src/gpt2.py", line 49, in softmax
    e = np.exp(x - x.max(axis=-1, keepdims=True))
ValueError: zero-size array to reduction operation maximum which has no identity
"""
WPE_CRASH = """Traceback (your code, most recent call last):
  File "src/kvcache.py", line 70, in embed_token
    return w["wte.weight"][token_id] + w["wpe.weight"][position]
IndexError: index 1024 is out of bounds for axis 0 with size 1024
"""


def test_error_signatures_name_the_classic_bugs():
    """Would catch: the softmax crash or an index past wpe left without their lesson, or a
    lesson given for an error whose place does not fit it."""
    from theinference.diagnosis.errors import lesson_for

    assert lesson_for(error_case("a", SOFTMAX_CRASH))[0].id == "attend-old-length"
    assert lesson_for(error_case("a", WPE_CRASH))[0].id == "position-counter"
    elsewhere = SOFTMAX_CRASH.replace("softmax", "norm").replace("attend", "stats")
    assert lesson_for(error_case("a", elsewhere.replace("scores", "rows"))) is None
    typo = "Traceback:\n  File \"src/kvcache.py\", line 3, in f\nNameError: name 'x' is not defined"
    assert lesson_for(error_case("a", typo)) is None


def test_student_traceback_keeps_did_you_mean_and_a_syntax_error_frame_once(tmp_path):
    """Would catch: Python 3.11's traceback module dropping "Did you mean", and a SyntaxError
    whose file and line are printed twice."""
    import importlib

    from theinference.student.worker.worker import describe_exception, student_traceback

    (tmp_path / "typo_mod.py").write_text(
        "def f():\n    seq_len = 3\n    return seq_lne\n\ndef g(a):\n    return a.reshap(3)\n"
    )
    (tmp_path / "broken_mod.py").write_text("def broken(:\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("typo_mod")
        for call, suggestion in ((module.f, "'seq_len'"), (lambda: module.g([]), None)):
            try:
                call()
            except Exception as exc:  # noqa: BLE001
                text = student_traceback(exc, str(tmp_path))
                assert 'File "typo_mod.py"' in text
                if suggestion:
                    assert f"Did you mean: {suggestion}?" in text
                    assert f"Did you mean: {suggestion}?" in describe_exception(exc)
        with pytest.raises(SyntaxError) as caught:
            importlib.import_module("broken_mod")
        text = student_traceback(caught.value, str(tmp_path))
        assert text.count('File "broken_mod.py", line 1') == 1, text
        assert "SyntaxError" in text and str(tmp_path) not in text
    finally:
        sys.path.remove(str(tmp_path))


def test_shape_hint_names_an_extra_leading_axis():
    """Would catch: [1, 768] explained as one row per position."""
    from theinference.curriculum.checks.values import shape_hint
    from theinference.oracle.config import GPT2_124M as config

    one = shape_hint((1, 768), (768,), config)
    assert "extra leading axis" in one and "per position" not in one
    assert "one per position" in shape_hint((5, 768), (768,), config)


def test_an_import_failure_is_shown_once_per_run_and_a_shared_error_once_per_stage():
    """Would catch: the same traceback printed for every case and again for every stage."""
    from theinference.output.report import print_run
    from theinference.results import RunResult, StageResult, Status

    failure = SOFTMAX_CRASH.replace("ValueError: zero-size", "SyntaxError: zero-size")
    cases = [error_case(f"case {i}", failure) for i in range(4)]
    stages = [  # the grader found that every case shares the error (diagnosis/stage.py)
        StageResult(slug, slug, Status.ERROR, cases, shared_error=True)
        for slug in ("single-step-attention", "build-prefill")
    ]
    run = RunResult(stages, "synthetic", "0" * 64)
    import io

    from rich.console import Console

    out = Console(file=io.StringIO(), width=200)
    print_run(out, run)
    text = out.file.getvalue()
    assert text.count('File "src/gpt2.py", line 49') == 1, text
    assert "shown above, stage single-step-attention" in text


def test_diagnosis_names_the_worst_case_and_a_bug_a_judge_recognised():
    """Would catch: a stage reported by its first case only, or a diagnosis taken from a case
    the stage-level one contradicts."""
    from types import SimpleNamespace

    from theinference.diagnosis.stage import diagnose_stage
    from theinference.oracle.config import GPT2_124M
    from theinference.results import CaseResult, Status
    from theinference.results.compare import Tolerance, compare

    tol = Tolerance(1e-3, 1e-2)
    recompute = SimpleNamespace(w={}, config=GPT2_124M)  # no failure to simulate: no forward

    def failing(name: str, off: float) -> CaseResult:
        c = compare("x", np.full(4, off), np.zeros(4), tol)
        return CaseResult(name=name, status=Status.FAILED, comparisons=[c], hint="a generic hint")

    cases = [failing("small", 0.01), failing("big", 22.0)]
    found = diagnose_stage(cases, [], tol, recompute, "python")
    assert (found.first_case, found.worst_case) == ("small", "big")
    assert found.bug_name == "" and found.hint == "a generic hint" and not found.diagnosed
    cases[1].suspected_bug, cases[1].hint = "kv-swapped", "its check's own words"
    found = diagnose_stage(cases, [], tol, recompute, "python")
    assert found.suspected_bug == "kv-swapped" and found.bug_name == "K and V swapped"
    assert found.hint.startswith("Scores come from Q . K") and "its check's own" in found.hint
    assert found.first_case == "big" and found.worst_case is None  # the case shown is the worst


def test_next_step_names_the_following_stage_only_when_all_passed():
    """Would catch: a "next stage" shown while something fails, or the wrong stage named."""
    from tests.helpers import STAGES
    from theinference.output.report import next_step_line
    from theinference.results import RunResult, StageResult, Status

    def run(*pairs):
        return RunResult([StageResult(s, s, st) for s, st in pairs], "synthetic", "0" * 64)

    passed = run(("single-step-attention", Status.PASSED))
    assert "next stage: build-prefill" in next_step_line(passed, STAGES)
    assert next_step_line(run(("build-prefill", Status.FAILED)), STAGES) == ""
    assert "complete" in next_step_line(run(("prefix-caching", Status.PASSED)), STAGES)


def test_a_piped_log_is_not_hard_wrapped(tmp_path):
    """Would catch: lines cut at 80 columns when stdout is not a terminal."""
    course = make_course(tmp_path / ("a-long-folder-name-" * 6) / "course")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run(
        [sys.executable, "-m", "theinference", "test", "-C", str(course), "-s", STAGE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    ).stdout
    assert any(str(course) in line for line in out.splitlines()), out
    assert any("NOT PASSED ·" in line and " s" in line for line in out.splitlines()), out


def test_a_piped_log_with_a_width_wraps_rather_than_crops(monkeypatch):
    """Catches a log piped with COLUMNS set losing the end of every indented line (a hint, a
    case's summary) to the width instead of wrapping it."""
    from rich.text import Text

    from theinference.output.report import console, indented

    monkeypatch.setenv("COLUMNS", "60")
    words = [f"word{i}" for i in range(40)]
    out = console()
    assert not out.is_terminal  # pytest captures stdout
    with out.capture() as captured:
        out.print(indented(Text(" ".join(words))))
    lines = captured.get().splitlines()
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines), lines
    assert " ".join(captured.get().split()) == " ".join(words)


def test_stages_marks_where_the_student_is(tmp_path):
    """Would catch: `theinference stages` not saying which stage to work on next."""
    from theinference.grading.progress import record_progress
    from theinference.results import RunResult, StageResult, Status

    course = make_course(tmp_path / "c")
    passed = StageResult("single-step-attention", "t", Status.PASSED)
    record_progress(course, RunResult([passed], "synthetic", "0" * 64))
    out = subprocess.run(
        [sys.executable, "-m", "theinference", "stages", "-C", str(course)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    (marked,) = [line for line in out.splitlines() if "→" in line]
    assert "build-prefill" in marked
    assert "theinference test --stage build-prefill --watch" in out


def test_a_hint_fits_the_failure_it_sits_under():
    """Would catch: a suffix-position hint under a prompt that reused nothing, and a row-count
    hint under a cache whose shapes are right and whose first layers match: each check picks
    the hint from what it saw, and says where the answer departs."""
    from theinference.curriculum.checks.build_prefill import localise
    from theinference.curriculum.checks.prefix_caching import logits_and_reuse
    from theinference.curriculum.stages import stage_words
    from theinference.oracle.config import GPT2_124M
    from theinference.oracle.gpt2 import LayerKV
    from theinference.results.compare import Tolerance

    tol, words = Tolerance(1e-3, 1e-2), stage_words("prefix-caching")
    prompts = [[1, 2, 3], [1, 2, 4], [7, 8]]
    expected = np.zeros((3, GPT2_124M.vocab_size), np.float32)
    wrong = [[expected[i] + (i == 2), np.array(r)] for i, r in enumerate([0, 2, 0])]
    fresh = logits_and_reuse(wrong, [prompts], lambda args: expected, tol, GPT2_124M)
    assert fresh.hint == words["reused_nothing"] and fresh.where == {"prompt": 2}
    wrong[1][0] = expected[1] + 1
    reused = logits_and_reuse(wrong, [prompts], lambda args: expected, tol, GPT2_124M)
    assert reused.hint == words["logits"] and reused.where == {"prompt": 1}
    right = [LayerKV(np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32))] * 3
    pairs = [(kv.k, kv.v) for kv in right[:2]] + [(np.ones((2, 3, 4), np.float32), right[2].v)]
    drift = localise(pairs, right, tol)
    assert "layers 0-1 match" in drift.hint and drift.hint != stage_words("build-prefill")["cache"]
    assert drift.where == {"layer": 2, "tensor": "K", "position": 0, "head": 0}
