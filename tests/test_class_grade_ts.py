"""`theinference grade` and the Gradescope autograder on TypeScript submissions, and on a class
mixing TypeScript and Python: each submission is recognised by its own files and graded in its
own language over that language's template (course folders, a .zip, a .tar.gz, a loose
kvcache.ts), the course's runner is installed once for the whole class from the template's
lock file, and the gradebook and class report show each student's language.

npm is never reached: a stand-in `npm` on PATH "installs" the runner by copying the one
`.ci/run` installed in tests/fixtures/ts_runner, and counts its calls.
"""

import csv
import json
import os
import shutil
import threading
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import classroom_helpers as ch
from tests.test_typescript import BUGS_TS, NODE_MODULES, REFERENCE_TS, ts_course
from theinference.classroom import autograder, batch
from theinference.cli import app
from theinference.course.languages import TYPESCRIPT
from theinference.course.languages import runner as ts_runner

runner = CliRunner()
SETTINGS = 'language = "ts"\n[grading]\ntimeout = 60\nscores = { "single-step-attention" = 2 }\n'
OPTIONS = ["-s", "single-step-attention", "--case", "one token repeated 16 times", "--jobs", "2"]
EXPECTED = {  # student: (language, single-step-attention status, suspected bug)
    "ts-dir": ("ts", "passed", None),
    "ts-zip": ("ts", "passed", None),
    "ts-tar-bug": ("ts", "failed", "attend-old-length"),
    "ts-loose": ("ts", "passed", None),
    "py-zip-bug": ("python", "failed", "causal-mask-in-step"),  # Python in a TypeScript course
}


@pytest.fixture
def fake_npm(tmp_path, monkeypatch):
    """PATH with an `npm` whose `ci` copies the fixture runner and counts its calls; the
    runner's home in a fresh cache folder; no ready runner given."""
    bin_dir, calls = tmp_path / "fake-bin", tmp_path / "npm-calls"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = ci ] && cp -a {NODE_MODULES} ./node_modules\n'
    )
    (bin_dir / "npm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(ts_runner.READY_ENV, raising=False)
    for module in (batch, autograder):  # the runner's home: the grader's cache directory
        monkeypatch.setattr(module, "cache_dir", lambda: tmp_path / "cache")
    return calls


def ts_files(course: Path) -> dict[str, bytes]:
    return {k: v for k, v in ch.course_files(course).items() if not k.startswith("node_modules")}


def make_class(folder: Path, scratch: Path) -> Path:
    folder.mkdir()
    reference = ts_course(scratch / "reference", REFERENCE_TS)
    (reference / "node_modules").unlink()  # a student's node_modules is never used anyway
    shutil.copytree(reference, folder / "ts-dir")
    ch.as_zip(folder / "ts-zip.zip", ts_files(reference), wrapper="ts-zip-main/")
    buggy = BUGS_TS["attend-old-length"].planted(REFERENCE_TS).encode()
    ch.as_tar(folder / "ts-tar-bug.tar.gz", ts_files(reference) | {"src/kvcache.ts": buggy})
    (folder / "ts-loose").mkdir()
    (folder / "ts-loose" / "kvcache.ts").write_text(REFERENCE_TS)
    from tests.bugs import planted

    ch.add(folder, "py-zip-bug", planted("causal-mask-in-step"), "zip", scratch=scratch)
    return folder


@pytest.fixture
def graded(tmp_path, fake_npm, weights):
    course = tmp_path / "instructor"
    course.mkdir()
    (course / "theinference.toml").write_text(SETTINGS)
    subs = make_class(tmp_path / "submissions", tmp_path / "scratch")
    result = runner.invoke(app, ["grade", str(subs), "--out", str(tmp_path / "results"),
                                 "-C", str(course), *OPTIONS])
    assert "Traceback" not in result.output, result.output
    return tmp_path, result, fake_npm


def test_a_mixed_class_is_graded_each_in_its_language(graded):
    """Catches a TypeScript submission laid over the Python template (or the reverse, by the
    course's `language`), a loose kvcache.ts not placed in src/, the runner installed per
    submission (or not at all), and the gradebook or report without the language."""
    root, result, calls = graded
    assert result.exit_code == 0, result.output
    records = {p.stem: json.loads(p.read_text())
               for p in (root / "results" / "submissions").glob("*.json")}
    assert set(records) == set(EXPECTED)
    for sid, (language, status, bug) in EXPECTED.items():
        record = records[sid]
        (stage,) = record["stages"]
        assert (record["status"], record["language"], stage["status"]) == (
            "graded", language, status), (sid, record["message"], stage)
        assert stage["suspected_bug"] == bug, sid
    assert calls.read_text().split() == ["ci", "--no-audit", "--no-fund"]  # once for the class
    with (root / "results" / "gradebook.csv").open() as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert {sid: rows[sid]["language"] for sid in rows} == {
        sid: language for sid, (language, _, _) in EXPECTED.items()}
    report = runner.invoke(app, ["report", str(root / "results"), "--html",
                                 str(root / "class.html")])
    assert report.exit_code == 0, report.output
    page = (root / "class.html").read_text()
    assert "(1 Python, 4 TypeScript)" in page and "<td>TypeScript</td>" in page


def test_the_runner_is_installed_once_and_copied_without_the_compiler(tmp_path, fake_npm):
    """Catches concurrent graders each running npm ci, a half-installed runner being used, or
    a course given the 30 MB compiler it never needs for grading."""
    found: list[Path] = []
    cache = tmp_path / "cache"
    threads = [threading.Thread(target=lambda: found.append(TYPESCRIPT.runner.shared(cache)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(found)) == 1 and fake_npm.read_text().count("ci") == 1
    course = ts_course(tmp_path / "c")
    (course / "node_modules").unlink()
    ts_runner.give_runner(course, found[0])
    assert (course / "node_modules" / "tsx" / "package.json").is_file()
    assert not (course / "node_modules" / "typescript").exists()


def test_a_failed_install_is_the_submissions_row_not_a_crash(tmp_path, monkeypatch, weights):
    """Catches a grader traceback (or a silent pass) when npm cannot install the runner: the
    TypeScript submission gets a grader-error row saying so, the Python one is graded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text("#!/bin/sh\necho 'npm error network unreachable' >&2\nexit 1\n")
    (bin_dir / "npm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(ts_runner.READY_ENV, raising=False)
    monkeypatch.setattr(batch, "cache_dir", lambda: tmp_path / "cache")
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "ts").mkdir()
    (subs / "ts" / "kvcache.ts").write_text(REFERENCE_TS)
    ch.add(subs, "py", ch.reference(), "loose", scratch=tmp_path / "scratch")
    result = runner.invoke(app, ["grade", str(subs), "--out", str(tmp_path / "out"), *OPTIONS])
    assert "Traceback" not in result.output and result.exit_code == 1, result.output
    ts = json.loads((tmp_path / "out" / "submissions" / "ts.json").read_text())
    py = json.loads((tmp_path / "out" / "submissions" / "py.json").read_text())
    assert ts["status"] == "grader-error" and "network unreachable" in ts["message"]
    assert py["status"] == "graded" and py["stages"][0]["status"] == "passed"


@pytest.mark.slow  # the image's warm and a submission's every case, as Python's end-to-end
def test_the_gradescope_bundle_grades_typescript(tmp_path, fake_npm, weights, monkeypatch):
    """Catches a TypeScript course's setup.sh without Node, `warm` not installing the runner
    where run_autograder finds it, or the autograder grading a TypeScript submission as
    Python (or not at all)."""
    from tests.test_gradescope import gradescope_root, run_autograder

    settings = 'language = "ts"\n[grading]\nstages = ["single-step-attention"]\nseed = "none"\n'
    root = gradescope_root(tmp_path, settings, {"kvcache.ts": REFERENCE_TS})
    setup = (root / "source" / "setup.sh").read_text()
    assert "nodejs" in setup and "node --version" in setup
    cache = root / "theinference-cache"  # run_autograder's; the weights linked in, not remade
    cache.mkdir()
    try:
        os.link(weights.path, cache / weights.path.name)
    except OSError:  # another file system
        shutil.copyfile(weights.path, cache / weights.path.name)
    monkeypatch.setattr(autograder, "cache_dir", lambda: cache)
    warmed = runner.invoke(app, ["gradescope", "warm", "--settings",
                                 str(root / "source" / "theinference.toml")])
    assert warmed.exit_code == 0, warmed.output
    assert fake_npm.read_text().count("ci") == 1  # the runner, at image build time
    data = run_autograder(root, cache)
    (test,) = data["tests"]
    assert test["status"] == "passed" and test["score"] == test["max_score"], test["output"]
    assert fake_npm.read_text().count("ci") == 1  # and not again per submission


def test_a_python_course_bundle_installs_no_node(tmp_path):
    """Catches Node installed into every Python course's image."""
    from tests.test_gradescope import gradescope_root

    root = gradescope_root(tmp_path, "", {})
    assert "nodejs" not in (root / "source" / "setup.sh").read_text()
    with zipfile.ZipFile(tmp_path / "autograder.zip") as z:
        assert "setup.sh" in z.namelist()
