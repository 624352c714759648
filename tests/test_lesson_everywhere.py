"""The lesson lives in the results: a planted bug and an error that teaches, graded once, say the
same suspected bug, lesson and hint in the terminal, the watch screen, JSON, JUnit and
Gradescope; and `test --format gradescope` and `gradescope run` give the same results.json."""

import io
import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.bugs import REFERENCE, planted
from tests.helpers import make_course
from theinference.cli import app

STAGE = "single-step-attention"
# the attention runs before this position's K/V are appended: at the first step the cache is
# empty and NumPy's softmax raises over zero scores, in every case
ATTEND_FIRST = REFERENCE.read_text().replace(
    "    append_kv(cache, k, v)\n    return attend(q, cache, w, layer)",
    "    a = attend(q, cache, w, layer)\n    append_kv(cache, k, v)\n    return a",
)
runner = CliRunner()


def graded(tmp_path, weights, kvcache: str):
    """The stage's small cases graded, as the CLI grades them."""
    from theinference.curriculum.stages import load_stages, select
    from theinference.grading.grader import RunPlan, grade
    from theinference.student.setup import Limits, ProcessSetup

    (stage,) = select(load_stages(), [STAGE])
    stage = replace(stage, cases=stage.cases[:3], timeout=600)
    course = make_course(tmp_path / "c", kvcache)
    return grade(ProcessSetup(course, weights.path, Limits(timeout=600)), RunPlan([stage], weights))


def every_output(run) -> dict[str, str]:
    """The run as each output shows it: the terminal log, the watch screen, JSON, JUnit and
    Gradescope (whitespace folded: a terminal wraps where it likes)."""
    from theinference.output.formats import render
    from theinference.output.report import print_run
    from theinference.output.screen import draw, header

    def drawn(paint) -> str:
        out = Console(file=io.StringIO(), width=100_000)
        paint(out)
        return out.file.getvalue()

    junit = ET.fromstring(render(run, "junit"))
    texts = {
        "terminal": drawn(lambda out: print_run(out, run)),
        "screen": drawn(lambda out: draw(out, header("c", "w", ""), run, [STAGE], True)),
        "junit": " ".join([p.get("value") for p in junit.iter("property")]
                          + [e.text or "" for e in junit.iter()]),
        "json": json.dumps(json.loads(render(run, "json"))),
        "gradescope": json.dumps(json.loads(render(run, "gradescope"))),
    }
    return {name: " ".join(text.split()) for name, text in texts.items()}


def folded(text: str) -> str:
    return json.dumps(" ".join(text.split()))[1:-1]  # as it sits inside a JSON string


@pytest.mark.parametrize(
    "kvcache,lesson", [(planted("attend-old-length"), None), (ATTEND_FIRST, "attend-old-length")],
    ids=["planted-bug", "error-lesson"],
)
def test_every_output_says_the_same_suspected_bug_lesson_and_hint(tmp_path, weights, kvcache,
                                                                  lesson):
    """Would catch a diagnosis worked out while drawing (the terminal teaching what JSON, JUnit
    or Gradescope never carry), or an output that drops the bug, the lesson or the hint."""
    run = graded(tmp_path, weights, kvcache)
    (stage,) = run.stages
    assert stage.status.value == ("error" if lesson else "failed")
    assert stage.bug_name and stage.hint and stage.lesson == lesson
    if lesson is None:
        assert stage.suspected_bug == "attend-old-length" and stage.diagnosed
    else:
        assert stage.shared_error and "softmax got zero scores" in stage.hint
        names = "; ".join(c.name for c in stage.cases)  # a name may hold a comma: 3, not 4
        assert f"every case that ran (3: {names}) raised" in every_output(run)["terminal"]
    for name, text in every_output(run).items():
        for said in (stage.bug_name, stage.hint):
            assert (folded(said) if name in ("json", "gradescope") else said) in text, (name, said)
        if lesson and name not in ("terminal", "screen"):  # machines also get the lesson's id
            assert lesson in text, name


@pytest.mark.slow
def test_test_format_gradescope_and_gradescope_run_write_the_same_results(tmp_path):
    """Would catch the two Gradescope paths disagreeing: `test --format gradescope` scoring
    with the specs' defaults while `gradescope run` applies the course's [grading] (scores,
    partial credit, visibility)."""
    from tests.test_gradescope import gradescope_root, run_autograder

    settings = (
        '[grading]\nstages = ["single-step-attention"]\npartial_credit = true\ntimeout = 600\n'
        'scores = { "single-step-attention" = 5 }\nvisibility = "after_due_date"\nseed = 7\n'
    )  # one seed for both: the cache-use proof is drawn from it (else afresh in each run)
    kvcache = planted("attend-old-length")
    course = make_course(tmp_path / "course", kvcache)
    (course / "theinference.toml").write_text(settings)
    out = tmp_path / "from-test.json"
    done = runner.invoke(app, ["test", "-C", str(course), "-s", STAGE, "--timeout", "600",
                               "--seed", "7", "--format", "gradescope", "--output", str(out)])
    assert done.exit_code == 1, done.output
    root = gradescope_root(tmp_path / "gs", settings, {"kvcache.py": kvcache})
    from_run = run_autograder(root, tmp_path / "unused")
    from_test = json.loads(out.read_text())
    for data in (from_test, from_run):
        data.pop("execution_time")
        for key in ("content_sha256", "seed"):  # what only the autograder knows
            data["extra_data"].pop(key, None)
        # the seed's source: an option here, the course's settings there
        data["extra_data"].get("provenance", {}).pop("seed", None)
    assert from_test == from_run
    assert 0 < from_test["score"] < 5 and from_test["tests"][0]["visibility"] == "after_due_date"
