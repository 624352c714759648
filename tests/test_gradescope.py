"""The Gradescope side: results.json carries the diagnosis (status, suspected bug, hint,
allclose figures, trimmed traceback, capped output), visibility from [grading], hidden cases
after publication, partial credit; every results.json validates against the fields Gradescope
documents (schema/gradescope-results.json); the bundle runs end to end in a temporary root laid
out like Gradescope's."""

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from tests.bugs import planted
from tests.helpers import make_course
from theinference import __version__
from theinference.cli import app
from theinference.course.settings import Grading
from theinference.output.gradescope import gradescope_results
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.compare import Comparison, Tolerance

runner = CliRunner()
SCHEMA = json.loads(
    (Path(__file__).parents[1] / "theinference/output/schema/gradescope-results.json").read_text()
)


def comparison(worst: float, mismatched: int) -> Comparison:
    return Comparison(label="attention output", shape=(768,), mismatched=mismatched, total=768,
                      max_abs=0.5, max_abs_index=(3,), max_rel=2.0, max_rel_index=(3,),
                      worst=worst, worst_index=(3,), tolerance=Tolerance(1e-4, 1e-3))


def case(name, status, hidden=False, **extra) -> CaseResult:
    base = {"message": f"{name} {status}"}
    return CaseResult(name=name, status=Status(status), hidden=hidden, **(base | extra))


RESULTS = RunResult(
    weights_label="synthetic", weights_sha256="ab", seconds=12.4,
    stages=[
        StageResult("single-step-attention", "Attention", Status.FAILED, cases=[
            case("one token", "passed", comparisons=[comparison(0.01, 0)]),
            case("two tokens", "failed", comparisons=[comparison(812.0, 700)],
                 suspected_bug="attend-old-length", hint="append K/V first",
                 stdout="x" * 10_000),
            case("hidden case 1 (seed 5, 9 tokens)", "passed", hidden=True),
        ]),
        StageResult("build-prefill", "Prefill", Status.ERROR, cases=[
            case("short prompt", "error", message="NameError: name 'cahce' is not defined",
                 traceback="Traceback (most recent call last):\n"
                 + "".join(f'  File "src/kvcache.py", line {i}, in f\n' for i in range(60))
                 + "NameError: name 'cahce' is not defined")]),
    ],
)


def test_results_carry_the_diagnosis_and_validate():
    """Would catch the Gradescope output dropping what the terminal and JUnit show (the
    suspected bug, the hint, the figures, the student's file and line), an uncapped flood,
    or a field Gradescope does not document."""
    grading = Grading(stage_visibility={"build-prefill": "after_due_date"})
    data = gradescope_results(RESULTS, {"single-step-attention": 3, "build-prefill": 2}, grading)
    jsonschema.validate(data, SCHEMA)
    public, hidden, prefill = data["tests"]
    assert "Suspected bug:** `attend-old-length`" in public["output"]
    assert "append K/V first" in public["output"] and "812" in public["output"]
    assert "700 of 768" in public["output"] and "[... cut at 2000 characters]" in public["output"]
    assert len(public["output"]) < 6000
    assert 'src/kvcache.py", line 59' in prefill["output"] and "NameError" in prefill["output"]
    assert "[... 32 lines]" in prefill["output"]  # trimmed to the last frames, the student's
    assert hidden["visibility"] == "after_published" and "hidden" in hidden["tags"]
    assert (public["visibility"], prefill["visibility"]) == ("visible", "after_due_date")
    assert public["max_score"] + hidden["max_score"] == 3
    assert (public["score"], hidden["score"], data["score"]) == (0, 1.0, 1.0)


def test_partial_credit_scores_each_case():
    """Would catch partial_credit ignored (all or nothing) or miscounted."""
    data = gradescope_results(RESULTS, {"single-step-attention": 3, "build-prefill": 2},
                              Grading(partial_credit=True))
    jsonschema.validate(data, SCHEMA)
    assert [t["score"] for t in data["tests"]] == [1.0, 1.0, 0.0]
    assert data["tests"][0]["status"] == "failed"


def test_gradescope_and_the_gradebook_score_alike_but_for_a_partial_run():
    """Would catch the two scorings drifting: a student's partial run (cases left out) earning
    points in Gradescope's results.json, or the gradebook not scoring the cases an instructor
    chose (`grade --case`, also a partial run) as a full run scores them."""
    from theinference.classroom.records import stage_rows

    partial = replace(RESULTS, stages=[replace(s, partial=True) for s in RESULTS.stages])
    points = {"single-step-attention": 3, "build-prefill": 2}
    grading = Grading(partial_credit=True)
    for results, expected in ((RESULTS, [1.0, 1.0, 0.0]), (partial, [0.0, 0.0, 0.0])):
        tests = gradescope_results(results, points, grading)["tests"]
        assert [t["score"] for t in tests] == expected
        rows = stage_rows(results, points, grading)
        assert sum(r.score for r in rows) == pytest.approx(2.0)


def gradescope_root(tmp_path: Path, settings: str, submission: dict[str, str]) -> Path:
    """A temporary root laid out like Gradescope's: source/ (the bundle), submission/."""
    instructor = make_course(tmp_path / "instructor")
    (instructor / "theinference.toml").write_text(settings)
    bundle = tmp_path / "autograder.zip"
    built = runner.invoke(app, ["gradescope", "build", "-C", str(instructor), "--out", str(bundle)])
    assert built.exit_code == 0, built.output
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as z:
        assert {"setup.sh", "run_autograder", "theinference.toml"} <= set(z.namelist())
        z.extractall(root / "source")
    (root / "submission").mkdir()
    for name, text in submission.items():
        path = root / "submission" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "submission_metadata.json").write_text(json.dumps({"id": 424242}))
    return root


def run_autograder(root: Path, cache: Path) -> dict:
    env = dict(os.environ, THEINFERENCE_AUTOGRADER_ROOT=str(root),
               THEINFERENCE_AUTOGRADER_PYTHON=sys.executable, HOME=str(root / "home"))
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    data = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(data, SCHEMA)
    return data


def test_the_bundle_pins_this_version_and_installs_bubblewrap(tmp_path):
    """Would catch a setup.sh that installs another theinference, forgets bubblewrap, does
    not precompute the oracle, or does not even parse."""
    root = gradescope_root(tmp_path, "", {})
    setup = (root / "source" / "setup.sh").read_text()
    assert "bubblewrap" in setup and "gradescope warm" in setup and __version__ in setup
    assert (root / "source" / "theinference-src" / "theinference" / "cli.py").is_file()
    assert (root / "source" / "theinference-src" / "pyproject.toml").is_file()
    for script in ("setup.sh", "run_autograder"):
        assert subprocess.run(["bash", "-n", str(root / "source" / script)]).returncode == 0
    with zipfile.ZipFile(tmp_path / "autograder.zip") as z:  # unzip keeps these modes
        for script in ("setup.sh", "run_autograder"):
            assert (z.getinfo(script).external_attr >> 16) & 0o111 == 0o111


def test_a_refused_submission_still_gets_results(tmp_path, weights_cache):
    """Would catch run_autograder leaving Gradescope without results.json (a crash) when the
    submission cannot be taken (here: a symlink out of it)."""
    root = gradescope_root(tmp_path, "", {})
    os.symlink("/etc/passwd", root / "submission" / "kvcache.py")
    data = run_autograder(root, weights_cache)
    assert data["score"] == 0 and "symlink" in data["output"]


@pytest.mark.slow
def test_run_autograder_grades_end_to_end(tmp_path, weights_cache):
    """Would catch the autograder grading the wrong files, ignoring [grading] (stages, seed from
    the submission, visibility), or writing results Gradescope would refuse; `warm` must
    leave the oracle's answers cached."""
    settings = ('[grading]\nstages = ["single-step-attention"]\nseed = "submission"\n'
                'hidden_visibility = "hidden"\nscores = { "single-step-attention" = 4 }\n')
    root = gradescope_root(tmp_path, settings, {"kvcache.py": planted("attend-old-length")})
    warmed = runner.invoke(app, ["gradescope", "warm", "--settings",
                                 str(root / "source" / "theinference.toml")])
    assert warmed.exit_code == 0 and "6 public cases" in warmed.output, warmed.output
    data = run_autograder(root, weights_cache)
    public, hidden = data["tests"]
    assert data["extra_data"]["seed"] == 424242
    assert public["status"] == "failed" and "attend-old-length" in public["output"]
    assert hidden["visibility"] == "hidden" and public["max_score"] + hidden["max_score"] == 4
    assert data["score"] == public["score"] + hidden["score"]
