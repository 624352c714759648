"""generate-loop's refusal past the context: the exception must come up front, before any work.
A guard met once prefill has begun (at its first line, or deep in the decode after a 1020-token
prefill and four decode steps) raises the right exception too, but too late: it must fail, in
Python and in TypeScript alike."""

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

# the same late guard, met as soon as prefill is called: no work done yet, but too late still
IN_PREFILL_PY = [
    LATE_PY[0],
    ("def prefill(prompt_ids, w, mc):\n",
     "def prefill(prompt_ids, w, mc):\n"
     "    if len(prompt_ids) > 1000:\n"
     '        raise ValueError("position past the context")\n'),
]
IN_PREFILL_TS = [
    LATE_TS[0],
    ("export function prefill(promptIds: number[], w: Weights, mc: ModelCache): Float32Array {\n",
     "export function prefill(promptIds: number[], w: Weights, mc: ModelCache): Float32Array {\n"
     "  if (promptIds.length > 1000) throw new RangeError(\"position past the context\");\n"),
]
COURSES = {
    "python": (make_course, lambda: reference_text()),
    "ts": (ts_course, lambda: REFERENCE_TS),
}
LATE = {"python": {"deep": LATE_PY, "in-prefill": IN_PREFILL_PY},
        "ts": {"deep": LATE_TS, "in-prefill": IN_PREFILL_TS}}


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


@pytest.mark.parametrize(("language", "where"), [
    ("python", "deep"),
    ("python", "in-prefill"),
    ("ts", "in-prefill"),
    pytest.param("ts", "deep", marks=pytest.mark.slow),  # a 1020-token prefill in TypeScript
])
def test_a_refusal_after_the_work_fails_and_one_up_front_passes(language, where, tmp_path,
                                                                 weights):
    """Catches a late guard (the right exception, raised once prefill has been called, or only
    after prefill and several decode steps) counted as the refusal the stage asks for, or an
    up-front refusal failed."""
    make, text = COURSES[language]
    upfront = make(tmp_path / "upfront", text())
    late = make(tmp_path / "late", edited(text(), LATE[language][where]))
    good = refusal(upfront, weights)
    assert good.status.value == "passed", good.message
    bad = refusal(late, weights)
    assert bad.status.value == "failed", bad.message
    assert "only after prefill had run" in bad.message, bad.message
    assert "position past the context" in bad.message
