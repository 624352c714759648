"""Attacks on the grader itself, each by a submission graded through the real CLI in its own
process, in a throwaway HOME and cache directory: forging the oracle's stored answers (cold
and warm cache), tampering with the weights in place with the times put back, reading the
seed from /proc, the network, and files outside the course. Each asserts the attack fails
AND that a correct solution still passes afterwards on the very cache the attack ran against.
`bwrap` runs need a working bubblewrap; `none` runs show what remains without it
(docs/grading-untrusted.md)."""

import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.test_hostile import GOOD, answers_verify, submission
from theinference.grading.answer_cache import MAC_BYTES
from theinference.oracle import synthetic
from theinference.student import sandbox

needs_bwrap = pytest.mark.skipif(
    bool(sandbox.bwrap_problem()), reason=f"bubblewrap unusable here: {sandbox.bwrap_problem()}"
)
BOTH = [pytest.param("bwrap", marks=needs_bwrap), "none"]
CASE = "two tokens"
SEED = "982451653"


@pytest.fixture
def place(tmp_path, weights):
    """A throwaway HOME and cache (primed with a copy of the synthetic weights, so no test
    pays for making them), and a reference course: nothing outside tmp_path is touched."""
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    cache.mkdir()
    shutil.copyfile(weights.path, cache / weights.path.name)
    (cache / weights.path.name).chmod(0o444)
    return {"home": home, "cache": cache, "weights": cache / weights.path.name}


def grade(course: Path, place: dict, mode: str, *extra: str, env: dict | None = None):
    """One grader process; returns (the case's JSON, the whole JSON, the grader's output)."""
    out = course.parent / f"result-{mode}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "theinference", "test", "-C", str(course)]
    command += ["-s", "single-step-attention", "--case", CASE, "--timeout", "30"]
    command += ["--json", str(out), "--sandbox", mode, *extra]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("THEINFERENCE_")}
    environ |= {"HOME": str(place["home"]), "THEINFERENCE_CACHE_DIR": str(place["cache"])}
    done = subprocess.run(
        command, env=environ | (env or {}), capture_output=True, text=True, timeout=600
    )
    assert "Traceback (most recent call last)" not in done.stdout + done.stderr, done.stderr
    data = json.loads(out.read_text())
    assert data["sandbox"] == (mode if mode == "bwrap" else sandbox.choose(mode).kind)
    (case,) = [c for s in data["stages"] for c in s["cases"] if c["name"] == CASE]
    return case, data, done.stdout + done.stderr


def attack(tmp_path: Path, body: str) -> Path:
    """A course whose run_step_attention runs `body` (which must return)."""
    return submission(tmp_path / "attack", body)


def honest(tmp_path: Path) -> Path:
    return submission(tmp_path / "honest", GOOD)


def assert_cache_sound(place: dict) -> None:
    """The cache the runs used: the weights hold their recorded bytes and every stored
    answer carries a valid MAC under the cache's secret."""
    digest = hashlib.sha256(place["weights"].read_bytes()).hexdigest()
    assert digest == synthetic.SYNTHETIC_SHA256
    assert list((place["cache"] / "answers").rglob("*.answer")), "answers should be stored"
    assert answers_verify(place["cache"])


def forged_answer() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, array=np.zeros(768, dtype=np.float32))
    return b"\0" * MAC_BYTES + buffer.getvalue()


def honest_answer_names(tmp_path: Path, place: dict) -> list[str]:
    """The answer files a run of this case stores (their names are computable from public
    inputs; a scratch cache stands in for the attacker's own computation)."""
    scratch = {**place, "cache": tmp_path / "scratch-cache"}
    scratch["cache"].mkdir()
    shutil.copyfile(place["weights"], scratch["cache"] / place["weights"].name)
    grade(honest(tmp_path / "scratch"), scratch, "none")
    return [p.relative_to(scratch["cache"]).as_posix() for p in scratch["cache"].rglob("*.answer")]


@pytest.mark.parametrize("mode", BOTH)
def test_forged_answers_in_a_cold_cache_are_never_believed(mode, tmp_path, place):
    """Would catch the answer-cache poisoning: a submission that writes zeros as
    the stored answer for its own case and returns zeros, before the grader stored one."""
    names = honest_answer_names(tmp_path, place)
    body = (
        f"for name in {names!r}:\n"
        f"        path = os.path.join({str(place['cache'])!r}, name)\n"
        "        try:\n"
        "            os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        f"            open(path, 'wb').write({forged_answer()!r})\n"
        "        except OSError: pass\n"
        "    return np.zeros(768)"
    )
    case, _, _ = grade(attack(tmp_path, body), place, mode)
    assert case["status"] == "failed" and "outside tolerance" in case["message"]
    case, data, _ = grade(honest(tmp_path), place, mode)
    assert case["status"] == "passed" and data["passed"]
    assert_cache_sound(place)


@pytest.mark.parametrize("mode", BOTH)
def test_answers_rewritten_in_a_warm_cache_are_never_believed(mode, tmp_path, place):
    """Would catch poisoning of answers already stored: each file overwritten with zeros,
    or swapped for another case's genuine file (its MAC is for another key)."""
    grade(honest(tmp_path / "first"), place, "none")  # warm: answers on disk
    body = (
        f"files = sorted(glob.glob({str(place['cache'])!r} + '/answers/*/*.answer'))\n"
        "    for i, path in enumerate(files):\n"
        "        try:\n"
        "            other = open(files[(i + 1) % len(files)], 'rb').read()\n"
        f"            open(path, 'wb').write(other if i % 2 else {forged_answer()!r})\n"
        "        except OSError: pass\n"
        "    return np.zeros(768)"
    )
    course = attack(tmp_path, "import glob\n    " + body)
    case, _, _ = grade(course, place, mode)
    assert case["status"] == "failed" and "outside tolerance" in case["message"]
    case, data, _ = grade(honest(tmp_path), place, mode)
    assert case["status"] == "passed" and data["passed"]
    assert_cache_sound(place)


TAMPER = """import json, struct
    for path in ({cache_file!r}, os.environ['THEINFERENCE_WEIGHTS']):
        try:
            st = os.stat(path)
            os.chmod(path, 0o644)  # read-only stops nobody who owns the file
            with open(path, 'r+b') as f:
                (n,) = struct.unpack('<Q', f.read(8))
                begin, end = json.loads(f.read(n))['h.0.attn.c_proj.weight']['data_offsets']
                f.seek(8 + n + begin)
                f.write(bytes(end - begin))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            print('tampered with', path)
        except OSError as exc:
            print('could not tamper:', exc)
    w = load_weights()
    """


@pytest.mark.parametrize(
    "mode", [pytest.param("bwrap", marks=needs_bwrap), pytest.param("none", marks=pytest.mark.slow)]
)
def test_weights_tampered_in_place_move_nothing(mode, tmp_path, place):
    """Would catch in-place weight tampering with the times put back: the submission zeroes
    a layer-0 projection, then answers from the tampered weights. If the oracle read the same
    bytes, that answer would pass. Afterwards a correct solution must pass on the same cache
    (the altered file is made again, and the run says so)."""
    body = TAMPER.format(cache_file=str(place["weights"])) + GOOD
    case, data, out = grade(attack(tmp_path, body), place, mode)
    tampered = "tampered with" in case["stdout"]
    assert tampered == (data["sandbox"] == "none"), case["stdout"]  # as the grader's own user
    if tampered:  # the oracle computed on its own copy: the tampered answer is wrong
        assert case["status"] == "failed" and "outside tolerance" in case["message"]
    else:  # out of reach: the submission computed on the true weights
        assert case["stdout"].count("could not tamper") == 2 and case["status"] == "passed"
    case, data, out = grade(honest(tmp_path), place, mode)
    assert case["status"] == "passed" and data["passed"]
    assert ("had been altered" in " ".join(out.split())) == tampered
    assert_cache_sound(place)


SNOOP = f"""hits, looked = [], 0
    for pid in os.listdir('/proc'):
        for name in ('cmdline', 'environ'):
            try:
                looked += 1
                if b'{SEED}' in open(f'/proc/{{pid}}/{{name}}', 'rb').read():
                    hits.append((pid, name))
            except (OSError, ValueError):
                pass
    print('looked at', looked, 'found', hits)
    """


@needs_bwrap
def test_the_seed_cannot_be_read_from_proc_in_bwrap(tmp_path, place):
    """Would catch a student's process that shares the grader's PID namespace or environment:
    it would find the seed in /proc/<grader>/cmdline or /environ and learn the hidden cases."""
    course = attack(tmp_path, SNOOP + GOOD)
    case, _, _ = grade(course, place, "bwrap", "--seed", SEED, env={"THEINFERENCE_SEED": SEED})
    assert case["status"] == "passed"
    assert "looked at" in case["stdout"] and "found []" in case["stdout"], case["stdout"]


@needs_bwrap
def test_no_network_in_bwrap(tmp_path, place):
    """Would catch a sandbox sharing the host's network: the submission reaches a listener
    the test opens on 127.0.0.1 (a way to ship the hidden cases out, or fetch answers)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    body = (
        "try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'x')\n"
        "        print('connected')\n"
        "    except OSError as exc:\n"
        "        print('no network:', exc)\n    " + GOOD
    )
    case, _, _ = grade(attack(tmp_path, "import socket\n    " + body), place, "bwrap")
    assert "no network" in case["stdout"], case["stdout"]
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()
    assert case["status"] == "passed"


@needs_bwrap
def test_files_outside_the_course_are_out_of_reach_in_bwrap(tmp_path, place):
    """Would catch a bind too many: the submission reads a secret in the grader's HOME and
    writes into that HOME, the cache and the host's /tmp-like places it knows the path of."""
    secret = place["home"] / "secret.txt"
    secret.write_text("the answer key")
    targets = [place["home"] / "pwned", place["cache"] / "pwned", tmp_path / "pwned"]
    body = (
        "for path in (" + ", ".join(repr(str(p)) for p in [secret, *targets]) + "):\n"
        "        try:\n"
        "            if path.endswith('secret.txt'): print('read', open(path).read())\n"
        "            else: open(path, 'w').write('pwned'); print('wrote', path)\n"
        "        except OSError as exc:\n"
        "            print('refused', type(exc).__name__)\n    " + GOOD
    )
    case, _, _ = grade(attack(tmp_path, body), place, "bwrap")
    assert case["stdout"].count("refused") == 4, case["stdout"]
    assert "the answer key" not in json.dumps(case)
    assert not [p for p in targets if p.exists()]
    case, data, _ = grade(honest(tmp_path), place, "bwrap")
    assert data["passed"]
    assert_cache_sound(place)


def test_bwrap_refuses_to_grade_without_bubblewrap_and_auto_says_so(
    tmp_path, reference_course, monkeypatch
):
    """Would catch `--sandbox bwrap` grading unsandboxed where bubblewrap is missing (what a
    CI grader asked never to do), or `auto` falling back without a word."""
    from typer.testing import CliRunner

    from theinference.cli import app

    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    base = ["test", "-C", str(reference_course), "-s", "single-step-attention", "--case", CASE]
    refused = CliRunner().invoke(app, [*base, "--sandbox", "bwrap"])
    assert refused.exit_code == 2 and "apt-get install bubblewrap" in refused.output
    assert "Traceback" not in refused.output
    out = tmp_path / "auto.json"
    fallback = CliRunner().invoke(app, [*base, "--sandbox", "auto", "--json", str(out)])
    assert fallback.exit_code == 0, fallback.output
    assert json.loads(out.read_text())["sandbox"] in ("none", "unprivileged-user")
    assert "install bubblewrap" in " ".join(fallback.output.split())


def test_the_answer_cache_believes_only_files_it_signed(tmp_path):
    """Would catch answers trusted for their format alone: a file forged without the
    secret, one swapped in from another key, or the secret file readable by others."""
    from theinference.grading.answer_cache import KEY_FILE, AnswerCache

    def compute():
        return np.arange(4, dtype=np.float32)

    writer = AnswerCache("ab" * 32, tmp_path)
    writer.get_or_compute("c", [[1]], compute)
    writer.get_or_compute("c", [[2]], lambda: np.ones(4, np.float32))
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o077 == 0
    folder = tmp_path / "answers" / ("ab" * 8)
    one, two = (folder / f"{writer.key('c', [[n]])}.answer" for n in (1, 2))
    genuine = one.read_bytes()
    one.write_bytes(two.read_bytes())  # a valid file, for another key
    reader = AnswerCache("ab" * 32, tmp_path)
    assert reader.get_or_compute("c", [[1]], compute).tolist() == [0, 1, 2, 3]
    one.write_bytes(forged_answer())
    reader = AnswerCache("ab" * 32, tmp_path)
    assert reader.get_or_compute("c", [[1]], compute).tolist() == [0, 1, 2, 3]
    assert reader.rejected == 1 and one.read_bytes()[MAC_BYTES:] == genuine[MAC_BYTES:]
