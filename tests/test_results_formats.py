"""Machine-readable results: JSON against its published schema, JUnit that parses, the
Gradescope fields, the on-disk oracle cache, progress and hidden cases."""

import json
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.bugs import planted
from tests.helpers import STAGES, grade_course, make_course
from theinference import exits
from theinference.cli import app
from theinference.grading.answer_cache import AnswerCache
from theinference.oracle.gpt2 import LayerKV
from theinference.output.formats import SCHEMA_FILE

# one worker runs this file: the course graded once (`mixed_course`) serves every test here
pytestmark = pytest.mark.xdist_group("test_results_formats")

runner = CliRunner()


@pytest.fixture(scope="module")
def mixed_course(tmp_path_factory, weights):
    """A course whose stages pass, fail and get skipped, with a hidden-case seed."""
    course = make_course(tmp_path_factory.mktemp("mixed") / "c", planted("missing-ln-f"))
    out = tmp_path_factory.mktemp("out")
    result = runner.invoke(
        app,
        [
            "test",
            "-C",
            str(course),
            "--json",
            str(out / "r.json"),
            "--junit",
            str(out / "r.xml"),
            "--gradescope",
            str(out / "results.json"),
            "--seed",
            "5",
        ],
    )
    return course, out, result


def test_files_are_written_even_when_stages_fail(mixed_course):
    _, out, result = mixed_course
    assert result.exit_code == exits.NOT_PASSED
    assert {p.name for p in out.iterdir()} == {"r.json", "r.xml", "results.json"}


def test_json_validates_against_the_published_schema(mixed_course):
    import jsonschema

    _, out, _ = mixed_course
    data = json.loads((out / "r.json").read_text())
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))
    statuses = {s["slug"]: s["status"] for s in data["stages"]}
    assert statuses == {"single-step-attention": "passed", "build-prefill": "failed"} | {
        slug: "skipped" for slug in STAGES[2:]
    }
    failed = next(c for c in data["stages"][1]["cases"] if c["status"] == "failed")
    assert failed["comparisons"][0]["worst_tolerance_multiple"] > 1
    assert data["weights"]["sha256"] and data["environment"]["numpy"] == np.__version__
    t = data["timings"]
    # summed over the cases, which a run grades beside each other on every core (--jobs)
    cores = os.cpu_count() or 1
    assert t["student_seconds"] + t["oracle_seconds"] <= cores * t["total_seconds"] + 1e-3
    cases = data["stages"][0]["cases"]
    # the seed's two hidden cases, marked hidden; their names no longer carry the seed
    hidden = [c for c in cases if c["hidden"]]
    assert len(hidden) == 2 and all("hidden case" in c["name"] for c in hidden)
    assert not any("seed 5" in c["name"] for c in cases)


def test_junit_parses_with_a_suite_per_stage(mixed_course):
    _, out, _ = mixed_course
    root = ET.parse(out / "r.xml").getroot()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == set(STAGES)
    assert int(suites["build-prefill"].get("failures")) >= 1
    assert suites["build-prefill"].find("testcase/failure") is not None
    assert suites["full-decode-step"].find("testcase/skipped") is not None
    assert suites["single-step-attention"].get("failures") == "0"


def test_gradescope_results_have_the_fields_gradescope_reads(mixed_course):
    _, out, _ = mixed_course
    data = json.loads((out / "results.json").read_text())
    from theinference.curriculum.stages import load_stages

    total = sum(s.score for s in load_stages())
    assert sum(t["max_score"] for t in data["tests"]) == pytest.approx(total)
    first = [t for t in data["tests"] if "single-step-attention" in t["tags"]]
    assert data["score"] == pytest.approx(sum(t["max_score"] for t in first))
    assert {"score", "tests", "execution_time", "visibility"} <= data.keys()
    for t in data["tests"]:
        assert {"name", "score", "max_score", "status", "output", "visibility"} <= t.keys()
        assert t["status"] in ("passed", "failed")
    public = [t for t in data["tests"] if "hidden" not in t["tags"]]
    assert [t["status"] for t in public] == ["passed"] + ["failed"] * 5
    hidden = [t for t in data["tests"] if "hidden" in t["tags"]]
    assert hidden and all(t["visibility"] == "after_published" for t in hidden)


def test_json_to_stdout_is_json_alone(mixed_course):
    course, _, _ = mixed_course
    result = runner.invoke(
        app, ["test", "-C", str(course), "-s", "single-step-attention", "--format", "json"]
    )
    assert result.exit_code == exits.OK
    assert json.loads(result.stdout)["passed"] is True


def test_stages_shows_the_last_results(mixed_course):
    course, _, _ = mixed_course
    listing = runner.invoke(app, ["stages", "-C", str(course)])
    assert listing.exit_code == 0
    rows = {
        line.replace("→", "").split()[0]: line.split()[-1]
        for line in listing.stdout.splitlines()[1:]
        if line.strip() and not line.startswith("you are at")
    }
    assert rows["build-prefill"] == "failed" and rows["full-decode-step"] == "skipped"


def test_hidden_cases_depend_on_the_seed_only():
    from theinference.curriculum.stages import load_stages, with_hidden_cases

    stage = load_stages()[2]
    a = with_hidden_cases(stage, 1).cases[len(stage.cases) :]
    assert a == with_hidden_cases(stage, 1).cases[len(stage.cases) :]
    assert a != with_hidden_cases(stage, 2).cases[len(stage.cases) :]
    assert all(1 <= c.inputs["prompt"]["random"] <= 1023 for c in a)


def test_oracle_cache_hits_and_survives_damage(tmp_path):
    cache = AnswerCache("ab" * 32, tmp_path)
    calls = []

    def compute():
        calls.append(1)
        return np.arange(4, dtype=np.float32)

    assert cache.get_or_compute("c", [[1, 2]], compute).tolist() == [0, 1, 2, 3]
    fresh = AnswerCache("ab" * 32, tmp_path)  # another process: the disk answers
    assert fresh.get_or_compute("c", [[1, 2]], compute).tolist() == [0, 1, 2, 3]
    assert len(calls) == 1
    (file,) = (tmp_path / "answers").rglob("*.answer")
    file.write_bytes(b"garbage")
    damaged = AnswerCache("ab" * 32, tmp_path)
    assert damaged.get_or_compute("c", [[1, 2]], compute).tolist() == [0, 1, 2, 3]
    assert len(calls) == 2 and file.read_bytes() != b"garbage"  # rewritten
    other = AnswerCache("cd" * 32, tmp_path)  # other weights: never the same answer
    other.get_or_compute("c", [[1, 2]], compute)
    assert len(calls) == 3


def test_oracle_cache_round_trips_layer_kv(tmp_path):
    kv = [LayerKV(k=np.ones((2, 3, 4), np.float32), v=np.zeros((2, 3, 4), np.float32))] * 2
    AnswerCache("ef" * 32, tmp_path).get_or_compute("kv", [[1]], lambda: kv)
    back = AnswerCache("ef" * 32, tmp_path).get_or_compute("kv", [[1]], lambda: None)
    assert len(back) == 2 and back[1].k.shape == (2, 3, 4) and back[0].v.sum() == 0


def test_an_unwritable_cache_degrades_with_a_note(tmp_path, reference_course, weights):
    from theinference.grading.answers import Answers

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    oracle = Answers(weights, AnswerCache(weights.sha256, blocked))
    run = grade_course(reference_course, weights, ["single-step-attention"], oracle=oracle)
    assert run.passed
    assert oracle.cache.notes and "oracle cache off" in oracle.cache.notes[0]


def test_the_stage_diagnosis_reaches_json_and_junit(mixed_course):
    """Would catch: the suspected bug named on one case only (null on the others, nothing at
    stage level), or missing from JUnit where CI systems show it."""
    _, out, _ = mixed_course
    prefill = json.loads((out / "r.json").read_text())["stages"][1]
    assert prefill["suspected_bug"] == "missing-ln-f" and prefill["diagnosed"]
    assert prefill["candidates"] == ["missing-ln-f"] and prefill["hint"]
    assert prefill["partial"] is False and prefill["not_run"] == []
    root = ET.parse(out / "r.xml").getroot()
    suite = next(s for s in root.iter("testsuite") if s.get("name") == "build-prefill")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["suspected_bug"] == "missing-ln-f"
    assert "suspected bug" in suite.find("testcase/failure").text
