"""generate-loop's refusal past the context: the exception must come up front, before any work.
A guard met deep in the decode (after a 1020-token prefill and four decode steps) raises the
right exception too, but too late: it must fail, in Python and in TypeScript alike."""

from dataclasses import replace

import pytest

from tests.helpers import make_course, reference_text
from tests.test_typescript import REFERENCE_TS, ts_course
from theinference.curriculum.stages import load_stages, select
from theinference.grading.grader import grade
from theinference.student.process import Limits

CASE = "asking past the context must raise"
LATE_PY = [
    ('    if len(prompt_ids) + max_new_tokens > w["wpe.weight"].shape[0]:\n'
     '        raise ValueError("prompt plus new tokens exceed the context")\n', ""),
    ("def embed_token(token_id, position, w):\n",
     "def embed_token(token_id, position, w):\n"
     '    if position >= w["wpe.weight"].shape[0]:\n'
     '        raise ValueError("position past the context")\n'),
]
LATE_TS = [
    ("if (promptIds.length + maxNewTokens > nCtx(w)) {", "if (false) {"),
    ("  const d = w[\"wte.weight\"].shape[1];\n",
     "  if (position >= nCtx(w)) throw new RangeError(\"position past the context\");\n"
     "  const d = w[\"wte.weight\"].shape[1];\n"),
]


def edited(text: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def refusal(course, weights):
    (stage,) = select(load_stages(), ["generate-loop"])
    stage = replace(stage, cases=[c for c in stage.cases if c.name == CASE], timeout=300)
    (result,) = grade(course, [stage], weights, Limits(timeout=300)).stages[0].cases
    return result


@pytest.mark.parametrize("language", ["python", "ts"])
def test_a_refusal_after_the_work_fails_and_one_up_front_passes(language, tmp_path, weights):
    """Catches a late guard (the right exception, raised only after prefill and several decode
    steps) counted as the refusal the stage asks for, or an up-front refusal failed."""
    if language == "python":
        upfront = make_course(tmp_path / "upfront", reference_text())
        late = make_course(tmp_path / "late", edited(reference_text(), LATE_PY))
    else:
        upfront = ts_course(tmp_path / "upfront", REFERENCE_TS)
        late = ts_course(tmp_path / "late", edited(REFERENCE_TS, LATE_TS))
    good = refusal(upfront, weights)
    assert good.status.value == "passed", good.message
    bad = refusal(late, weights)
    assert bad.status.value == "failed", bad.message
    assert "only after prefill had run" in bad.message, bad.message
    assert "position past the context" in bad.message
