"""Containment through the real graders, each in its own process with a throwaway HOME and
cache: a daemon that outlives its grader (attack 7), class grading without bubblewrap running
the student as root and the seed on a command line (attacks 12 and 13), and the instructor's
minimum sandbox. Afterwards a correct solution graded on the same cache passes, and nothing
the attack started is running."""

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from tests import classroom_helpers as ch
from tests.test_containment import require_unprivileged
from tests.test_hostile import ESCAPEE, escapees
from tests.test_hostile_sandbox import BOTH, assert_cache_sound, attack, grade, honest, place

__all__ = ["place"]  # the fixture, shared

STOPPER = f"""import ctypes, os, signal, sys, time
ctypes.CDLL(None).prctl(15, b'{ESCAPEE}', 0, 0, 0)
while True:
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if pid == sys.argv[1]:
                continue  # its own worker: the next submission's is the target
            if b'worker.py' in open(f'/proc/{{pid}}/cmdline', 'rb').read():
                os.kill(int(pid), signal.SIGSTOP)
        except (OSError, ValueError):
            pass
    time.sleep(0.05)
"""
DAEMON = (
    "worker = str(os.getpid())\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        if os.fork() == 0:\n"
    f"            os.execve(sys.executable, [sys.executable, '-c', {STOPPER!r}, worker], {{}})\n"
    "        os._exit(0)\n"
    "    time.sleep(0.3)\n"
    "    return layer_attn_incremental(embed(seq_ids, w), w, 0)[-1]"
)


@pytest.mark.parametrize("mode", BOTH)
def test_a_daemon_that_stops_workers_dies_with_its_run(mode, tmp_path, place):
    """Attack 7: a daemon (fork, setsid, fork, re-exec with an empty environment, so no token)
    that stops every worker it can see. Would catch it outliving its grader, then freezing
    the worker of the next, correct submission graded on the machine (which would time out)."""
    if mode == "none":
        require_unprivileged()  # as root, `--sandbox none` drops to a uid of its own
    case, data, _ = grade(attack(tmp_path, DAEMON), place, mode)
    assert case["status"] == "passed", case["message"]
    time.sleep(0.3)
    assert not escapees(), "the daemon outlived the grader"
    case, data, _ = grade(honest(tmp_path), place, mode)
    assert case["status"] == "passed" and data["passed"], case["message"]
    assert_cache_sound(place)


SEED = "982451653"
SPY = (
    "hits = []\n"
    "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "        try:\n"
    f"            if b'{SEED}' in open(f'/proc/{{pid}}/cmdline', 'rb').read(): hits.append(pid)\n"
    "        except OSError: pass\n"
    "    try: key = open(os.environ['SPY_KEY'], 'rb').read(); print('read the key')\n"
    "    except (OSError, KeyError): print('no key')\n"
    "    print('uid', os.getuid(), 'seed in', hits)\n"
    "    return layer_attn_incremental(embed(seq_ids, w), w, 0)[-1]"
)


def test_class_grading_without_bubblewrap_drops_to_a_uid_of_its_own(tmp_path, place):
    """Attacks 12 and 13: would catch `grade` running the student as root where bubblewrap
    cannot run (its 0700 work folders kept the drop from applying), the seed put on the test
    process's command line where any process reads it, or the mode missing from the record
    and the gradebook."""
    require_unprivileged()
    key = place["cache"] / "answer-key"
    spy = ch.reference()
    folder = tmp_path / "subs"
    folder.mkdir()
    ch.add(folder, "spy", spy, "dir", SPY.replace("os.environ['SPY_KEY']", repr(str(key))))
    course = tmp_path / "instructor"
    course.mkdir()
    (course / "theinference.toml").write_text(f"[grading]\nseed = {SEED}\ntimeout = 30\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("THEINFERENCE_")}
    env |= {"HOME": str(place["home"]), "THEINFERENCE_CACHE_DIR": str(place["cache"])}
    env["PATH"] = str(tmp_path / "no-bwrap-here")  # bubblewrap cannot be found: the drop
    out = tmp_path / "results"
    command = [sys.executable, "-m", "theinference", "grade", str(folder), "--out", str(out)]
    command += ["-C", str(course), "-s", "single-step-attention", "--case", "two tokens"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "sandbox: unprivileged-user" in done.stderr
    record = json.loads((out / "submissions" / "spy.json").read_text())
    assert (
        record["sandbox"] == "unprivileged-user"
        and record["results"]["sandbox"] == record["sandbox"]
    )
    (case,) = record["results"]["stages"][0]["cases"]
    assert case["status"] == "passed", case["message"]
    assert "no key" in case["stdout"] and "seed in []" in case["stdout"], case["stdout"]
    uid = int(case["stdout"].split("uid ")[1].split()[0])
    assert uid not in (0, 65534)
    with (out / "gradebook.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["sandbox"] == "unprivileged-user"
    assert_cache_sound(place)


def test_grading_below_the_instructors_minimum_is_refused(tmp_path, place):
    """Would catch `grade` and the Gradescope autograder grading without bubblewrap when the
    course asks for it ([grading] sandbox = "bwrap"), silently, instead of refusing with a
    message and exit code 2 (the autograder still writes a results.json saying why)."""
    course = tmp_path / "instructor"
    course.mkdir()
    (course / "theinference.toml").write_text('[grading]\nsandbox = "bwrap"\n')
    folder = tmp_path / "subs"
    folder.mkdir()
    ch.add(folder, "ref", ch.reference())
    env = {k: v for k, v in os.environ.items() if not k.startswith("THEINFERENCE_")}
    env |= {"HOME": str(place["home"]), "THEINFERENCE_CACHE_DIR": str(place["cache"])}
    env["PATH"] = str(tmp_path / "no-bwrap-here")
    command = [sys.executable, "-m", "theinference", "grade", str(folder), "--out"]
    done = subprocess.run(
        [*command, str(tmp_path / "out"), "-C", str(course)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to grade below [grading] sandbox = 'bwrap'" in " ".join(done.stderr.split())
    assert not (tmp_path / "out" / "gradebook.csv").exists()
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    (root / "source" / "theinference.toml").write_text('[grading]\nsandbox = "bwrap"\n')
    (root / "submission").mkdir()
    autograder = [sys.executable, "-m", "theinference", "gradescope", "run", "--root", str(root)]
    done = subprocess.run(autograder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and "sandbox" in results["output"]


def test_the_seed_never_reaches_a_command_line(tmp_path):
    """Would catch `grade` or the autograder passing the hidden cases' seed as `--seed N`,
    readable in /proc/<pid>/cmdline by every process on the machine."""
    from theinference.classroom.batch import Plan
    from theinference.grading.seed import Seed

    plan = Plan(weights="synthetic", points={"single-step-attention": 1.0},
                seed=Seed(int(SEED), "option"))
    command = plan.test_command(tmp_path / "course", tmp_path / "out.json")
    assert SEED not in " ".join(command) and "--seed" not in command
    assert plan.test_env()["THEINFERENCE_SEED"] == SEED
    assert "THEINFERENCE_SEED" not in Plan(weights="synthetic", points={}).test_env()


def test_every_report_names_the_mode(tmp_path, reference_course):
    """Would catch a format that leaves out how the student's process was isolated: the
    terminal's summary line, the JSON, a JUnit property, Gradescope's output and extra data."""
    from xml.etree import ElementTree

    from typer.testing import CliRunner

    from theinference.cli import app
    from theinference.student.sandbox import choose

    files = {name: tmp_path / f"r.{name}" for name in ("json", "junit", "gradescope")}
    command = ["test", "-C", str(reference_course), "-s", "single-step-attention"]
    command += ["--case", "two tokens"]
    for name, path in files.items():
        command += [f"--{name}", str(path)]
    result = CliRunner().invoke(app, command)
    kind = choose("auto").kind
    assert result.exit_code == 0, result.output
    assert f"sandbox {kind}" in " ".join(result.output.split())
    data = json.loads(files["json"].read_text())
    assert data["sandbox"] == kind and isinstance(data["notes"], list)
    suite = ElementTree.parse(files["junit"]).getroot().find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["sandbox"] == kind and "sandbox_notes" in props
    gradescope = json.loads(files["gradescope"].read_text())
    assert gradescope["extra_data"]["sandbox"] == kind
    assert f"Sandbox: {kind}." in gradescope["output"]


def test_an_unknown_minimum_sandbox_is_a_clear_error(tmp_path):
    """Would catch a typo in [grading] sandbox (e.g. "bubblewrap") accepted and ignored,
    grading in whatever mode the machine gives instead of the one asked for."""
    from theinference.course.settings import SettingsError, parse_settings

    with pytest.raises(SettingsError, match="auto, unprivileged-user, bwrap"):
        parse_settings({"grading": {"sandbox": "bubblewrap"}})
    assert parse_settings({"grading": {"sandbox": "bwrap"}}).grading.sandbox == "bwrap"
