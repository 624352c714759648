"""generate-loop's refusal past the context: the exception must come up front, before any work,
judged by what the call cost (its CPU time, from outside, against one forward's floor over the
prompt), not by which function it came from. A guard met deep in the decode, after a
1020-token prefill and four decode steps, raises the right exception too, but too late: it
must fail, in Python and in TypeScript alike. A guard at prefill's first line, before any work,
is a refusal up front by its cost, whatever the function is called."""

from dataclasses import replace

import pytest

from tests.helpers import make_course, reference_text
from tests.test_typescript import REFERENCE_TS, ts_course
from theinference.course.directory import course_language
from theinference.course.languages import TYPESCRIPT
from theinference.curriculum.stages import load_stages, select
from theinference.grading.grader import RunPlan, grade
from theinference.student import sandbox
from theinference.student.setup import Limits, ProcessSetup

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

# the guard met as soon as prefill is called: no work done yet, so up front by its cost
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
    # TypeScript's CPU account is a cgroup its process cannot leave (a uid of its own, given
    # by a root grader); Python's runs as the grader's own user, forbidden to start a process
    chosen = sandbox.without_bwrap([]) if course_language(course) is TYPESCRIPT else None
    setup = ProcessSetup(course, weights.path, Limits(timeout=300), sandbox=chosen)
    run = grade(setup, RunPlan([stage], weights))
    (result,) = run.stages[0].cases
    return result


@pytest.mark.parametrize(("language", "where", "passes"), [
    ("python", "deep", False),
    ("python", "in-prefill", True),
    ("ts", "in-prefill", True),
    pytest.param("ts", "deep", False, marks=pytest.mark.slow),  # a 1020-token TS prefill
])
def test_a_refusal_after_the_work_fails_and_one_up_front_passes(language, where, passes,
                                                                 tmp_path, weights):
    """Catches a late guard (the right exception, raised only after prefill and several decode
    steps) counted as the refusal the stage asks for; an up-front refusal failed, wherever it
    sits (a function's name is no evidence); a verdict without the figures."""
    make, text = COURSES[language]
    upfront = make(tmp_path / "upfront", text())
    guarded = make(tmp_path / "guarded", edited(text(), LATE[language][where]))
    good = refusal(upfront, weights)
    assert good.status.value == "passed", good.message
    assert "up front" in good.message and "s of CPU" in good.message, good.message
    other = refusal(guarded, weights)
    if passes:
        assert other.status.value == "passed", other.message
    else:
        assert other.status.value == "failed", other.message
        assert "refuses too late" in other.message and "one forward" in other.message


LAZY_ADAPTER = '''

_loaded = []


def run_generate(prompt_ids, max_new_tokens):  # noqa: F811
    if not _loaded:  # a model built on the first call: a forward's worth of work, no request's
        w = load_weights()
        prefill(list(range(1000)), w, fresh_cache(w))
        _loaded.append(w)
    return generate(prompt_ids, max_new_tokens, _loaded[0])
'''


def test_a_model_loaded_on_the_first_call_is_not_work_on_the_refused_request(tmp_path, weights):
    """Catches a refusal judged with the adapter's own first-call loading counted as work on
    the request (a lazily built model, then the check up front, failed as "the work had
    begun"), and a warm-up that would hide a refusal made after the work (the late guard of
    test_a_refusal_after_the_work_fails_and_one_up_front_passes still fails)."""
    course = make_course(tmp_path / "lazy", reference_text())
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text() + LAZY_ADAPTER)
    result = refusal(course, weights)
    assert result.status.value == "passed", result.message
