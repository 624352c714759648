"""A measured case whose cache is swapped, tried beside the other cases first
(grading/swap_first.py): its verdict stands where the swap proves the cache read, and the
floor judges it, measured alone in a fresh process, only where the swap proves nothing."""

import pytest

from tests.helpers import make_course, reference_text
from tests.test_swap_beside_floor import cost_stage, graded
from theinference.curriculum.checks.common import Verdict
from theinference.curriculum.checks.swap import ASK_AGAIN, FOLLOWED, SwapPlan
from theinference.curriculum.stages import with_run_draws
from theinference.grading.swap_first import floor_only, needs_floor
from theinference.results import Status
from theinference.student.process import StudentProcess
from theinference.student.replies import Outcome

# correct, and its cache out of the search's sight: every K/V float kept as its bits XORed
# with a key (no float, int or bfloat16 view of them is a K/V row), read back at each use
HIDDEN_CACHE = '''

_KEY = np.uint32(0x5A5A5A5A)


def _hide(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) ^ _KEY


def _shown(a):
    return (a ^ _KEY).view(np.float32)


class LayerCache:
    def __init__(self, heads: int = 12):
        self.k = np.zeros((heads, 0, HEAD_DIM), dtype=np.uint32)
        self.v = np.zeros((heads, 0, HEAD_DIM), dtype=np.uint32)

    @property
    def length(self) -> int:
        return self.k.shape[1]


def append_kv(cache, k, v):
    cache.k = np.concatenate([cache.k, _hide(k)], axis=1)
    cache.v = np.concatenate([cache.v, _hide(v)], axis=1)


def attend(q, cache, w, layer):
    keys, values = _shown(cache.k), _shown(cache.v)
    scores = q @ keys.transpose(0, 2, 1) / math.sqrt(HEAD_DIM)
    a = merge_heads(softmax(scores) @ values)[0]
    return a @ w[f"h.{layer}.attn.c_proj.weight"] + w[f"h.{layer}.attn.c_proj.bias"]
'''


@pytest.fixture
def alone_calls(monkeypatch) -> list[str]:
    """The adapters called alone in a fresh process (StudentProcess.call_alone), in order."""
    called: list[str] = []
    call_alone = StudentProcess.call_alone

    def recorded(self, adapter, *args, **named):
        called.append(adapter)
        return call_alone(self, adapter, *args, **named)

    monkeypatch.setattr(StudentProcess, "call_alone", recorded)
    return called


def test_a_generation_that_follows_its_swap_is_never_measured_alone(
    tmp_path, weights, answers, alone_calls
):
    """Catches a case the swap settled measured again alone (a save paying for the cost
    proof twice), and its pass no longer saying what the call cost beside the floor."""
    course = make_course(tmp_path / "c", reference_text())
    case = graded(course, weights, answers, cost_stage(8))
    assert case.status == Status.PASSED, case.message
    assert case.message.startswith(FOLLOWED.split(":")[0]), case.message
    assert "CPU time" in case.message and "recompute's arithmetic needs" in case.message
    assert alone_calls == []


def test_a_try_beside_takes_a_rate_minutes_old_and_measures_none(
    tmp_path, weights, answers, monkeypatch
):
    """Catches the try's CPU budget and its pass's cost figure asking for the machine's rate
    within the floors' minute (FRESH_FOR): a student saving minutes apart paid a calibration
    process, a second of CPU, beside every run of a stage with a cost proof. A rate within
    BOUNDS_FOR serves them (they decide no verdict); none is measured."""
    from theinference.student import calibration

    course = make_course(tmp_path / "c", reference_text())
    measured: list = []
    monkeypatch.setattr(calibration, "measure",
                        lambda process: measured.append(process) or (90e9, ""))
    monkeypatch.setattr(calibration, "_SOON", {})
    minutes_ago = calibration.time.monotonic() - 5 * calibration.FRESH_FOR
    kept: dict = {}
    monkeypatch.setattr(calibration, "_MEASURED", kept)
    real_key = calibration.rate_key

    def measured_minutes_ago(process):  # the course's rate, as if measured 5 minutes before
        key = real_key(process)
        kept.setdefault(key, (minutes_ago, 90e9))
        return key

    monkeypatch.setattr(calibration, "rate_key", measured_minutes_ago)
    case = graded(course, weights, answers, cost_stage(8))
    assert case.status == Status.PASSED, case.message
    assert "CPU time" in case.message and "recompute's arithmetic needs" in case.message
    assert measured == [], "the try measured the machine again"


def test_a_cache_the_swap_cannot_find_is_judged_by_the_floor_measured_alone(
    tmp_path, weights, answers, alone_calls
):
    """Catches a right answer passed on a swap that was never made (no evidence of a cache at
    all), and a floor judged from a call made beside other cases: correct code whose cache the
    search cannot see is called again alone, in a fresh process, and passes by its cost."""
    course = make_course(tmp_path / "c", reference_text() + HIDDEN_CACHE)
    case = graded(course, weights, answers, cost_stage(16))
    assert case.status == Status.PASSED, case.message
    assert "the cost of a cache" in case.message, case.message
    assert not case.message.startswith(FOLLOWED.split(":")[0]), case.message
    assert alone_calls == ["run_generate"]


# the classic recompute, its cache out of the search's sight: a fresh cache and a prefill of the
# whole sequence for every token
RECOMPUTE_HIDDEN = HIDDEN_CACHE + '''


def generate(prompt_ids, max_new_tokens, w):
    if len(prompt_ids) + max_new_tokens > w["wpe.weight"].shape[0]:
        raise ValueError("past the context")
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(np.argmax(prefill(ids, w, ModelCache(n_layer(w), n_head(w))))))
    return ids[len(prompt_ids):]
'''


def test_a_recompute_the_swap_cannot_see_is_stopped_early_beside_and_failed_alone(
    tmp_path, weights, answers, alone_calls, monkeypatch
):
    """Catches a try beside with no CPU limit before its swap (a student whose decode still
    recomputes waited for the whole recompute, then for the floor's measured call), and a
    verdict taken from the try's stop rather than from the floor measured alone."""
    kinds: list[str] = []
    call = StudentProcess.call

    def recorded(self, adapter, *args, **named):
        outcome = call(self, adapter, *args, **named)
        if adapter == "run_generate":  # not the calibration's
            kinds.append(outcome.kind)
        return outcome

    monkeypatch.setattr(StudentProcess, "call", recorded)
    course = make_course(tmp_path / "c", reference_text() + RECOMPUTE_HIDDEN)
    case = graded(course, weights, answers, cost_stage(16))
    assert case.status == Status.FAILED and case.suspected_bug == "decode-recomputes", case
    assert kinds == ["cpu_limit", "cpu_limit"], kinds  # the try, stopped before any swap; alone
    assert alone_calls == ["run_generate"]


# a recompute that knows the proof's fixed prompt from the spec: its answer made when the module
# is imported (unmeasured, by the cache), every other generation recomputed (RECOMPUTE_HIDDEN)
KNOWS_THE_PROMPT = "\n_cached_generate = generate\n" + RECOMPUTE_HIDDEN + """

_recomputed = generate
_KNOWN = {}


def _spec_prompt(count, seed):  # the spec's `{ random = N, seed = S }`, expanded as the grader does
    return [int(x) for x in np.random.PCG64(seed).random_raw(count) % np.uint64(50257)]


def _remember(count, seed, new_tokens):
    from src.gpt2 import load_weights

    prompt = _spec_prompt(count, seed)
    _KNOWN[tuple(prompt), new_tokens] = _cached_generate(prompt, new_tokens, load_weights())


def generate(prompt_ids, max_new_tokens, w):
    known = _KNOWN.get((tuple(prompt_ids), max_new_tokens))
    return list(known) if known is not None else _recomputed(prompt_ids, max_new_tokens, w)


_remember(240, 77, 16)
"""


def test_a_recompute_that_knows_the_fixed_prompt_meets_the_floor_on_a_fresh_one(
    tmp_path, weights, answers, alone_calls
):
    """Catches the floor judging a proof on its fixed prompt (the swap's, kept across runs, so
    public): a recompute that made that prompt's answer when imported, where no CPU is
    measured, and never builds a cache the swap could find, passed the floor in no time. The
    floor alone meets a prompt drawn for the run, and stops the recompute there."""
    course = make_course(tmp_path / "c", reference_text() + KNOWS_THE_PROMPT)
    case = graded(course, weights, answers, cost_stage(16))
    assert case.status == Status.FAILED and case.suspected_bug == "decode-recomputes", case
    assert alone_calls == ["run_generate"]


def swap_plan(sent: bool) -> SwapPlan:
    plan = SwapPlan("prefill", 1, [], [], None, lambda: None)
    plan.sent = sent
    return plan


APPLIED = {"swap": {"applied": True}}


@pytest.mark.parametrize(
    ("status", "message", "kind", "plan", "report", "asked", "floor"),
    [
        (Status.PASSED, FOLLOWED, "returned", swap_plan(True), APPLIED, True, False),
        (Status.PASSED, "", "returned", swap_plan(False), None, True, True),
        (Status.PASSED, "", "returned", swap_plan(False), APPLIED, True, True),  # said, not sent
        (Status.PASSED, "", "returned", None, None, True, True),  # no swap drawn
        (Status.FAILED, "", "timeout", swap_plan(False), None, True, True),
        (Status.FAILED, "", "cpu_limit", swap_plan(False), None, True, True),
        (Status.FAILED, ASK_AGAIN, "returned", swap_plan(True), APPLIED, True, True),
        (Status.FAILED, ASK_AGAIN, "returned", swap_plan(True), APPLIED, False, False),
        (Status.FAILED, "wrong tokens", "returned", swap_plan(False), None, True, False),
        (Status.ERROR, "raised", "raised", swap_plan(False), None, True, False),
    ],
)
def test_only_the_floor_judges_what_the_swap_beside_left_open(
    status, message, kind, plan, report, asked, floor
):
    """Catches a pass resting on no swap (or on the student's word that it was made), a
    timeout or a departing answer the diagnosis wants judged beside other cases rather than
    by the floor alone, and a failure by what was returned measured again for nothing."""
    outcome = Outcome(kind)
    outcome.probe = report
    verdict = Verdict(status, message=message)
    assert needs_floor(verdict, outcome, plan, lambda: asked) == floor


@pytest.mark.parametrize(
    ("kind", "most", "alone_by_floor"),
    [
        ("cpu_limit", 23040, False),  # its search was finding the cache: swapped alone
        ("timeout", 23040, False),
        ("cpu_limit", 0, True),  # a cache the search never saw: no search to pay for alone
        ("timeout", 0, True),
        ("returned", 23040, True),  # a right answer on no swap, or one asked again
    ],
)
def test_a_try_stopped_before_the_swap_of_a_cache_it_was_finding_is_swapped_alone(
    kind, most, alone_by_floor
):
    """Catches a try that ran out of its budget while its search was finding the cache,
    before the swap was sent, judged by the floor alone: a correct cache slower than the floor
    allows failed as a recompute (the preallocated pool's prefix-caching did, whenever the
    search of its 75 MB pool at each layer outran the try's budget); and a cache the search
    never saw measured alone with a search it would pay for in its CPU time."""
    plan = swap_plan(False)
    plan.most = most
    assert floor_only(Outcome(kind), plan) == alone_by_floor


def test_every_case_a_floor_may_judge_meets_it_on_inputs_drawn_for_the_run():
    """Catches a measured case whose floor meets the fixed, public inputs its spec gives (the
    1000 + 24 generation did): an answer made for them when the module is imported, where no
    CPU is measured, passed that floor in no time."""
    from theinference.curriculum.checks import CHECKS
    from theinference.curriculum.stages import drawn_per_run, for_floor, load_stages
    from theinference.grading.judging import is_measured
    from theinference.oracle.config import ModelConfig

    config = ModelConfig(n_layer=12, n_embd=768, vocab_size=50257, n_ctx=1024)
    measured = [
        (stage.slug, spec, drawn)
        for stage in load_stages()
        for spec, drawn in zip(stage.cases, with_run_draws(stage, 1).cases, strict=True)
        if not drawn.inputs.get("must_raise") and is_measured(
            CHECKS[drawn.check], drawn, CHECKS[drawn.check].arguments(drawn, config), config)
    ]
    assert len(measured) >= 3, measured  # the cost proofs and the long generation at least
    for slug, spec, drawn in measured:
        assert drawn_per_run(spec) and "drawn" in for_floor(drawn).inputs, (slug, spec.name)
