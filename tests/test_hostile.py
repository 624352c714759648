"""Broken and hostile submissions, through the real CLI: each gets an honest status that can
never read as a pass, the grader never tracebacks or hangs, every process the submission
started is gone afterwards, and the grader's weights and oracle cache are untouched.

Each entry replaces run_step_attention in an otherwise correct course (the reference
solution), or breaks src/kvcache.py, and grades one case of single-step-attention.
"""

import hashlib
import hmac
import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import alive, make_course, reference_text
from theinference.cli import app
from theinference.grading.answer_cache import KEY_FILE, MAC_BYTES
from theinference.oracle import synthetic

# one worker runs this file: `caches_stay_intact` checks the cache every test here graded with
pytestmark = pytest.mark.xdist_group("test_hostile")

runner = CliRunner()
TIMEOUT = "3"
# the name a submission's leftover process gives itself (/proc/*/comm), this test process's
# own: tests running beside it (pytest-xdist's other worker, another checkout) leave theirs
ESCAPEE = f"ti-esc-{os.getpid()}"[:15]
NAME_ME = f"ctypes.CDLL(None).prctl(15, b'{ESCAPEE}', 0, 0, 0)"  # PR_SET_NAME

GOOD = "return layer_attn_incremental(embed(seq_ids, w), w, 0)[-1]"
SUBMISSIONS = {
    # id: (body of run_step_attention after `w = load_weights()`, status, text in the report)
    "returns None": ("return None", "failed", "returned None"),
    "returns a string": ("return 'logits'", "failed", "returned a str"),
    "returns a dict": ("return {'a': 1}", "failed", "returned a dict"),
    "returns a ragged list": ("return [[1.0], [1.0, 2.0]]", "failed", "not numbers of one shape"),
    "returns a 0-d array": ("return np.float32(1.0)", "failed", "expected shape [768], got []"),
    "returns an object array": ("return np.array([object()] * 768)", "failed", "dtype object"),
    "returns complex numbers": (f"return np.asarray({GOOD[7:]}) + 0j", "failed", "complex"),
    "returns integers": (f"return np.asarray({GOOD[7:]}).astype(int)", "failed", "int64 values"),
    "right length, wrong shape": (
        f"return {GOOD[7:]}.reshape(24, 32)",
        "failed",
        "right numbers, wrong shape",
    ),
    "returns NaN": (f"out = {GOOD[7:]}.copy(); out[5] = np.nan; return out", "failed", "NaN"),
    "returns Inf": (f"out = {GOOD[7:]}.copy(); out[7] = np.inf; return out", "failed", "Inf"),
    "raises an exception": ("raise RuntimeError('boom')", "error", "RuntimeError: boom"),
    "raises KeyboardInterrupt": ("raise KeyboardInterrupt", "error", "KeyboardInterrupt"),
    "raises SystemExit(0)": ("raise SystemExit(0)", "error", "sys.exit(0)"),
    "raises SystemExit(1)": ("raise SystemExit(1)", "error", "sys.exit(1)"),
    "calls os._exit(0)": ("os._exit(0)", "error", "exited with code 0"),
    "kills itself with SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)", "error", "SIGKILL"),
    "segfaults through ctypes": ("ctypes.string_at(0)", "error", "SIGSEGV"),
    "monkeypatches numpy.allclose": (
        "np.allclose = lambda *a, **k: True; np.testing.assert_allclose = lambda *a, **k: None\n"
        "    return np.zeros(768)",
        "failed",
        "outside tolerance",
    ),
    "uses weights of its own": (
        # the layer the step reads, scaled (all 500 MB copied outran the 3 s timeout under load)
        "w = {k: v * 1.01 if k.startswith('h.0.') else v for k, v in w.items()}\n    " + GOOD,
        "failed",
        "outside tolerance",
    ),
    "prints a forged result": (
        "print('{\"status\": \"passed\"}'); os.write(1, b'\\x10' + b'\\0' * 7 + b'{}')\n"
        "    return np.zeros(768)",
        "failed",
        "outside tolerance",
    ),
    "changes directory": ("os.chdir('/')\n    " + GOOD, "passed", ""),
    "mutates its input": (
        "seq_ids.append(0); seq_ids.pop(); seq_ids.reverse(); seq_ids.reverse()\n    " + GOOD,
        "passed",
        "",
    ),
    "deletes course files": (  # read-only in bwrap: the attempt fails, the grading does not
        "try: os.remove('src/gpt2.py')\n    except OSError: pass\n    " + GOOD,
        "passed",
        "",
    ),
    "writes into the grader's cache": (
        "for root in (os.environ.get('THEINFERENCE_CACHE_DIR', ''), "
        "os.path.expanduser('~/.cache/theinference')):\n"
        "        if root and os.path.isdir(root):\n"
        "            for name in os.listdir(root):\n"
        "                if name.endswith('.safetensors'):\n"
        "                    try: open(os.path.join(root, name), 'r+b').write(b'x' * 64)\n"
        "                    except OSError: pass\n"
        "    return np.zeros(768)",
        "failed",
        "outside tolerance",
    ),
    "leaves a child process running": (
        "if os.fork() == 0:\n        " + NAME_ME + "; time.sleep(600); os._exit(0)\n    " + GOOD,
        "passed",
        "",
    ),
    "leaves a daemon that left the group": (
        "if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            " + NAME_ME + "; time.sleep(600)\n"
        "        os._exit(0)\n"
        "    time.sleep(0.2)\n"
        "    " + GOOD,
        "passed",
        "",
    ),
}
SLOW_SUBMISSIONS = {
    "an infinite loop": ("while True: pass", "timeout", "timed out after 3 s"),
    "ignores SIGTERM and SIGALRM and catches everything": (
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGALRM, "
        "signal.SIG_IGN)\n    while True:\n        try: time.sleep(1)\n"
        "        except BaseException: pass",
        "timeout",
        "timed out after 3 s",
    ),
    "sleeps just past the timeout": ("time.sleep(3.3)\n    " + GOOD, "timeout", "timed out"),
    "allocates 20 GiB": (
        "x = np.ones(20 * 1024**3 // 8)\n    return x[:768]",
        "error",
        "MemoryError",
    ),
    "prints 100 MB to stdout and stderr": (
        "sys.stdout.write('x' * 50_000_000); sys.stderr.write('y' * 50_000_000)\n    " + GOOD,
        "passed",
        "output cut at 64 KiB",
    ),
}
BROKEN_KVCACHE = {
    # id: (edit to src/kvcache.py, status, text)
    "a syntax error in kvcache.py": ("def attn_step(:\n", "error", "SyntaxError"),
    "an import error in kvcache.py": (
        "import numpy_but_misspelled\n",
        "error",
        "ModuleNotFoundError",
    ),
}
PREAMBLE = "import ctypes, os, signal, sys, time\nimport numpy as np\n"


def submission(
    tmp_path: Path, body: str | None = None, kvcache_edit: str = "", adapters_edit: str = ""
) -> Path:
    course = make_course(tmp_path / "course", reference_text() + kvcache_edit)
    adapters = course / "tests" / "adapters.py"
    text = adapters.read_text() + adapters_edit
    if body is not None:
        text += "\n\n" + PREAMBLE + "\n\ndef run_step_attention(seq_ids):\n    w = load_weights()\n"
        text += "    " + body + "\n"  # later lines of a body carry their own indent
    adapters.write_text(text)
    return course


def grade(course: Path, tmp_path: Path, *options: str) -> tuple[dict, str, float]:
    out = tmp_path / "results.json"
    started = time.monotonic()
    result = runner.invoke(
        app,
        [
            "test",
            "-C",
            str(course),
            "-s",
            "single-step-attention",
            "--case",
            "two tokens",
            "--timeout",
            TIMEOUT,
            "--json",
            str(out),
            *options,
        ],
    )
    elapsed = time.monotonic() - started
    assert "Traceback (most recent call last)" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == (0 if json.loads(out.read_text())["passed"] else 1)
    (case,) = json.loads(out.read_text())["stages"][0]["cases"]
    return case, result.output, elapsed


def check(course: Path, tmp_path: Path, status: str, text: str) -> float:
    case, output, elapsed = grade(course, tmp_path)
    assert case["status"] == status, (case["status"], case["message"], output)
    blob = json.dumps(case)
    assert text in blob or text in output, (text, case["message"], output[-2000:])
    time.sleep(0.3)
    assert not escapees(), "a process the submission started outlived the run"
    return elapsed


def escapees() -> list[int]:
    """Live processes named ESCAPEE: found through the host's /proc whatever PID namespace
    they ran in (a pid the submission writes down would be its namespace's, not ours)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == ESCAPEE:
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if alive(pid)]


@pytest.fixture(scope="module", autouse=True)
def caches_stay_intact(weights, weights_cache):
    """The cache these runs used (the session's THEINFERENCE_CACHE_DIR): the weights keep
    their recorded bytes, answers stored before are unchanged, and every answer verifies."""

    def digest() -> dict[str, str]:
        files = [weights.path, *sorted(weights_cache.rglob("*.answer"))]
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}

    before = digest()
    yield
    after = digest()
    assert {k: after.get(k) for k in before} == before
    assert after[str(weights.path)] == synthetic.SYNTHETIC_SHA256
    assert len(after) > 1, "the catalogue's runs should have stored answers in this cache"
    assert answers_verify(weights_cache)


def answers_verify(cache: Path) -> bool:
    """Every stored answer carries a valid MAC under the cache's secret."""
    secret = (cache / KEY_FILE).read_bytes()
    for path in cache.rglob("*.answer"):
        blob = path.read_bytes()
        mac = hmac.new(secret, path.stem.encode() + b"\0" + blob[MAC_BYTES:], hashlib.sha256)
        if not hmac.compare_digest(blob[:MAC_BYTES], mac.digest()):
            return False
    return True


@pytest.mark.parametrize("name", list(SUBMISSIONS))
def test_submission(name, tmp_path):
    body, status, text = SUBMISSIONS[name]
    check(submission(tmp_path, body), tmp_path, status, text)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_SUBMISSIONS))
def test_slow_submission(name, tmp_path):
    body, status, text = SLOW_SUBMISSIONS[name]
    elapsed = check(submission(tmp_path, body), tmp_path, status, text)
    assert elapsed < float(TIMEOUT) + 15  # the timeout plus a small margin, never a hang


@pytest.mark.parametrize("name", list(BROKEN_KVCACHE))
def test_broken_kvcache(name, tmp_path):
    edit, status, text = BROKEN_KVCACHE[name]
    check(submission(tmp_path, kvcache_edit="\n" + edit), tmp_path, status, text)


def test_a_missing_adapter(tmp_path):
    course = submission(tmp_path, adapters_edit="\n\ndel run_step_attention\n")
    check(course, tmp_path, "error", "has no function run_step_attention")


def test_an_adapter_with_the_wrong_signature(tmp_path):
    course = submission(tmp_path, adapters_edit="\n\ndef run_step_attention(a, b):\n    return 1\n")
    check(course, tmp_path, "error", "cannot take 1 argument")


def test_two_graders_at_once_share_one_fresh_cache(tmp_path, reference_course):
    import os
    import subprocess
    import sys

    cache = tmp_path / "fresh-cache"
    env = {**os.environ, "THEINFERENCE_CACHE_DIR": str(cache)}
    command = [
        sys.executable,
        "-m",
        "theinference",
        "test",
        "-C",
        str(reference_course),
        "-s",
        "single-step-attention",
        "--case",
        "two tokens",
    ]
    graders = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [g.communicate(timeout=300)[0] for g in graders]
    assert [g.returncode for g in graders] == [0, 0], outputs
    assert all("PASSED" in out for out in outputs)
    made = [p.name for p in cache.iterdir() if p.suffix == ".safetensors"]
    assert len(made) == 1 and not [p for p in cache.iterdir() if ".tmp" in p.name]


def test_an_unusable_cache_directory_is_one_clear_error(tmp_path, reference_course, monkeypatch):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file")
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(blocked))
    result = runner.invoke(app, ["test", "-C", str(reference_course)])
    assert result.exit_code == 4 and "cache directory" in result.output
    assert "Traceback" not in result.output


def test_limits_are_named_when_hit(tmp_path):
    course = submission(
        tmp_path,
        "sys.stdout.write('z' * 10_000)\n    x = np.ones(2 * 1024**3 // 8)\n    return x[:768]",
    )
    case, _, _ = grade(course, tmp_path, "--memory-gb", "1", "--output-kb", "1")
    assert case["status"] == "error" and "the grader's limit: 1 GiB" in case["message"]
    assert "output cut at 1 KiB" in case["stdout"]


def test_a_stage_spec_sets_its_own_limits(tmp_path, weights):
    from dataclasses import replace

    from theinference.curriculum.stages import load_stages
    from theinference.grading.grader import RunPlan, grade
    from theinference.student.setup import ProcessSetup

    course = submission(
        tmp_path,
        "sys.stdout.write('z' * 5000)\n    x = np.empty(3 * 1024**3 // 8)\n    return x[:768]",
    )
    first = load_stages()[0]
    stage = replace(first, cases=tuple(c for c in first.cases if c.name == "two tokens"))
    tight = replace(stage, slug="tight", memory_bytes=2 * 2**30, output_bytes=2048)
    # the spec's limits, then the run's own
    run = grade(ProcessSetup(course, weights.path), RunPlan([tight, stage], weights))
    first, second = (s.cases[0] for s in run.stages)
    assert "the grader's limit: 2 GiB" in first.message and "output cut at 2 KiB" in first.stdout
    assert second.status.value == "failed"  # 8 GiB: the allocation succeeds, the answer is wrong
    assert "output cut" not in second.stdout
