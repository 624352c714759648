"""The swap in the stages a floor judged alone: generate-loop's cache swapped right after the
prompt's prefill, prefix-caching's right after its first prompt. Answers over K/V no token
sequence has prove the cache is read, however slow the code, where the CPU floor alone failed
correct code at about 8x (generate-loop) and 4x (prefix-caching) the reference's cost; a
recompute still fails, by the swap where its cache is found and by the floor where none is."""

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import make_course, reference_text, slowed_plans
from tests.solutions.slow_caches import SLOW_CACHES, slow_cache
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.checks import generate_loop as gl
from theinference.curriculum.checks import prefix_caching as pc
from theinference.curriculum.checks.swap import FOLLOWED, Seen, prompt_state, random_ids
from theinference.curriculum.stages import load_stages
from theinference.results import Status
from theinference.results.compare import Tolerance
from theinference.student.cpu import CpuTime
from theinference.student.setup import Limits, ProcessSetup
from theinference.student.watchdog import Watchdog

TOL = Tolerance(atol=1e-3, rtol=1e-2)

# correct, and slow on purpose: every decode step burns a second of CPU, as a cache cast to
# float64 at every use, or one that copies the model's cache every step, spends its time
SLOW_STEPS = '''

_fast_decode_step = decode_step


def decode_step(token_id, position, w, mc):
    import time as _time

    until = _time.process_time() + 1.0
    while _time.process_time() < until:
        sum(range(20000))  # arithmetic: user time, as a recompute's
    return _fast_decode_step(token_id, position, w, mc)
'''

# a cache filled by the prefill and never read: every token recomputed from the ids
CACHE_UNREAD = '''

def generate(prompt_ids, max_new_tokens, w):
    if len(prompt_ids) + max_new_tokens > w["wpe.weight"].shape[0]:
        raise ValueError("past the context")
    kept = ModelCache(n_layer(w), n_head(w))
    logits = prefill(prompt_ids, w, kept)
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(np.argmax(logits)))
        logits = recompute_logits(ids, w)[-1]
    return ids[len(prompt_ids):]
'''


def cost_stage(new_tokens: int):
    """generate-loop with one cost proof: a fixed 240-token prompt, `new_tokens` new ones (its
    floor alone meets a prompt drawn for the run, as the spec's)."""
    (stage,) = [s for s in load_stages() if s.slug == "generate-loop"]
    (case,) = [c for c in stage.cases if c.check == "generate_cost"]
    inputs = {"prompt": {"random": 240, "seed": 77}, "max_new_tokens": new_tokens,
              "floor_draw": {"prompt": {"random": [240, 240]}}}  # as the spec's
    return replace(stage, cases=(replace(case, inputs=inputs),), timeout=600)


def graded(course: Path, weights, answers, stage):
    from theinference.grading.grader import RunPlan, grade

    setup = ProcessSetup(course, weights.path, Limits(timeout=600))
    run = grade(setup, RunPlan([stage], weights, answers, seed=5))
    (case,) = run.stages[0].cases
    return case


def test_a_slow_generation_that_reads_its_cache_passes_over_the_swap(tmp_path, weights, answers):
    """Catches a floor that still decides where the swap has proven cache use: this correct
    generation spends over its floor's budget (a second of CPU a step) and must pass, by its
    tokens over the swapped cache, with what it cost said beside."""
    course = make_course(tmp_path / "c", reference_text() + SLOW_STEPS)
    case = graded(course, weights, answers, cost_stage(6))
    assert case.status == Status.PASSED, case.message
    assert case.message.startswith(FOLLOWED.split(":")[0]), case.message
    seconds, floor = (float(x) for x in re.findall(r"([\d.]+) s", case.message)[:2])
    stage = cost_stage(6)
    share = float(stage.words["floor_fraction"])
    assert seconds > share * floor, (seconds, floor, "the call was within the floor's budget")


def test_a_generation_that_ignores_its_swapped_cache_fails_saying_it_recomputes(
    tmp_path, weights, answers
):
    """Catches a swap whose tokens are not judged over it: a generation that fills a cache and
    recomputes from the ids gives the original greedy tokens, and fails naming the recompute."""
    course = make_course(tmp_path / "c", reference_text() + CACHE_UNREAD)
    case = graded(course, weights, answers, cost_stage(4))
    assert case.status == Status.FAILED, case
    assert "recomputes the sequence" in case.message, case.message
    assert case.suspected_bug == "decode-recomputes", case


def test_the_swap_is_drawn_only_where_it_moves_greedys_path(weights, answers):
    """Catches a swap a recompute passes: the plan's draw must make the original greedy tokens
    (a recompute's) depart over the swapped cache; one new token has nothing to swap."""
    from theinference.oracle.recompute import Recompute

    recompute = Recompute(weights.tensors, weights.config)
    assert gl.swap_after_prompt(recompute, [[464, 2068], 1], 3, prompt_state) is None
    prompt = random_ids(40, 9, weights.config.vocab_size)
    plan = gl.swap_after_prompt(recompute, [prompt, 12], 3, prompt_state)
    assert plan is not None and plan.expected is None
    plain = [int(x) for x in recompute_greedy(recompute, prompt, 12)]
    over_swap = plan.along(plain)  # [12, vocab]
    assert over_swap.shape == (12, weights.config.vocab_size)
    assert np.array_equal(over_swap[0], recompute.last_logits(prompt).astype(over_swap.dtype))
    assert gl.departure(over_swap, plain, TOL.atol, TOL.rtol) is not None
    swapped = greedy_over(plan.along, 12, plain[0])
    assert gl.departure(plan.along(swapped), swapped, TOL.atol, TOL.rtol) is None


def recompute_greedy(recompute, prompt: list[int], count: int) -> list[int]:
    ids = list(prompt)
    for _ in range(count):
        ids.append(int(recompute.last_logits(ids).argmax()))
    return ids[len(prompt):]


def greedy_over(along, count: int, first: int) -> list[int]:
    """Greedy's tokens over the swapped cache after the prefill's own `first`."""
    tokens = [first]
    while len(tokens) < count:
        tokens.append(int(along(tokens + [0])[len(tokens)].argmax()))
    return tokens


def test_tokens_over_the_swap_are_judged_only_once_the_grader_sent_it(weights, answers):
    """Catches a pass resting on the student's own word: a report that says the swap was
    applied, with no writes sent by the grader, leaves the tokens to the floor."""
    from theinference.oracle.recompute import Recompute

    recompute = Recompute(weights.tensors, weights.config)
    prompt = random_ids(40, 9, weights.config.vocab_size)
    plan = gl.swap_after_prompt(recompute, [prompt, 6], 3, prompt_state)
    swapped = greedy_over(plan.along, 6, int(recompute.last_logits(prompt).argmax()))
    report = {"swap": {"applied": True}}
    measured = {"cpu_seconds": 50.0, "floor": 10.0, "limit": 6.0, "stopped": False}
    judge = CHECKS["generate_cost"].judge
    ask = lambda q: gl.expect_path(recompute, q)  # noqa: E731
    unsent = judge((np.array(swapped), measured, Seen(plan, report)), [prompt, 6], ask, TOL,
                   weights.config)
    assert unsent.status == Status.FAILED and "recompute" in unsent.message, unsent
    plan.sent = True
    sent = judge((np.array(swapped), measured, Seen(plan, report)), [prompt, 6], ask, TOL,
                 weights.config)
    assert sent.status == Status.PASSED, sent


def test_a_generation_whose_swap_landed_inside_its_prefill_is_judged_after_its_first_token(
    weights,
):
    """Catches a correct generation failed for its first token over the swap: a prefill that
    reads each layer's K/V back from the cache once written is swapped before its last layer's
    attention reads them (tests/test_cache_use.py), which may move its own logits' argmax;
    every later token must still be greedy's over the swapped cache, along the student's."""
    from theinference.oracle.recompute import Recompute

    recompute = Recompute(weights.tensors, weights.config)
    prompt = random_ids(40, 9, weights.config.vocab_size)
    plan = gl.swap_after_prompt(recompute, [prompt, 6], 3, prompt_state)
    plan.sent = True
    last = int(recompute.last_logits(prompt).argmin())  # far from the prefill's argmax
    moved = greedy_over(plan.along, 6, last)
    seen = Seen(plan, {"swap": {"applied": True}})
    ask = lambda q: gl.expect_path(recompute, q)  # noqa: E731
    verdict = gl.over_swapped(np.array(moved), seen, [prompt, 6], ask, TOL, weights.config)
    assert verdict.status == Status.PASSED, verdict.message
    wrong_later = moved[:3] + [(moved[3] + 1) % weights.config.vocab_size] + moved[4:]
    verdict = gl.over_swapped(np.array(wrong_later), seen, [prompt, 6], ask, TOL, weights.config)
    assert verdict.status == Status.FAILED, verdict.message
    # a recompute after that first token: the original's greedy path along it, never a pass
    recomputed = [last, *recompute_greedy(recompute, [*prompt, last], 5)]
    verdict = gl.over_swapped(np.array(recomputed), seen, [prompt, 6], ask, TOL, weights.config)
    assert verdict.status == Status.FAILED, verdict.message
    # ... even where the swap moves no token along that path: then it proves nothing
    unmoved = replace(plan, along=lambda tokens: gl.expect_path(recompute, [prompt, tokens]))
    verdict = gl.over_swapped(np.array(recomputed), Seen(unmoved, seen.report), [prompt, 6],
                              ask, TOL, weights.config)
    assert verdict.status == Status.FAILED, verdict.message


def test_a_cpu_limit_ends_once_the_swap_is_sent():
    """Catches a measured call stopped at its floor's budget after the swap proved its cache
    use (a slow correct generation would be failed), and a limit lifted before it."""
    sent = [False]
    dog = Watchdog(lambda: (CpuTime(9.0), set()), cpu_limit=1.0, lifted=lambda: sent[0])
    dog.next_look = 0.0
    breach = dog.poll()
    assert breach is not None and breach.kind == "cpu_limit", breach
    sent[0] = True
    dog.next_look = 0.0
    assert dog.poll() is None


# every token a full forward, no cache kept: each of its model's returns is a moment
NO_CACHE = '''

def generate(prompt_ids, max_new_tokens, w):
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(np.argmax(recompute_logits(ids, w)[-1])))
    return ids[len(prompt_ids):]
'''


def test_a_generation_with_no_cache_is_looked_at_for_a_bounded_number_of_returns(
    tmp_path, weights
):
    """Catches a watch that searches a recompute's memory at every return of its model (the
    call many times its own cost): where a floor is the fallback, the watch stops after
    MOMENTS moments and says why."""
    from theinference.curriculum.checks.swap import MOMENTS
    from theinference.oracle.recompute import Recompute
    from theinference.student.channel import Probe
    from theinference.student.process import StudentProcess

    course = make_course(tmp_path / "c", reference_text() + NO_CACHE)
    recompute = Recompute(weights.tensors, weights.config)
    prompt = [464, 2068, 7586]
    plan = gl.swap_after_prompt(recompute, [prompt, 24], 3, prompt_state)
    with StudentProcess(ProcessSetup(course, weights.path, Limits(timeout=300))) as worker:
        outcome = worker.call("run_generate", [prompt, 24], 300,
                              Probe("prefill", "returns", plan.answer))
    assert outcome.kind == "returned", outcome.message
    report = outcome.probe
    assert report["swap"]["stop"] and not plan.sent, report
    most = MOMENTS[0] + MOMENTS[1] * len(prompt)
    assert most < report["moments"] <= most + 2, report


def test_the_grader_looks_no_more_once_searches_stop_finding_more_rows():
    """Catches a search that never gives up on a cache it cannot find (or a recompute's layers
    that come and go), and one that gives up on a cache still being built."""
    from theinference.curriculum.checks.swap import SwapPlan

    plan = SwapPlan("prefill", 1, [], [], None, lambda: None, patience=4)
    building = [plan.gives_up(found) for found in (10, 20, 20, 20, 30, 30, 30, 30, 30)]
    assert building == [False] * 8 + [True], building
    never = SwapPlan("prefill", 1, [], [], None, lambda: None)
    assert not any(never.gives_up(0) for _ in range(100))


# correct, and slow on purpose: every prompt after the first burns a second of CPU
SLOW_PREFIX = '''

_FastPrefixCache = PrefixCache


class PrefixCache(_FastPrefixCache):
    def process(self, prompt_ids):
        import time as _time

        if getattr(self, "_burn", False):
            until = _time.process_time() + 1.0
            while _time.process_time() < until:
                sum(range(20000))  # arithmetic: user time, as a recompute's
        self._burn = True
        return super().process(prompt_ids)
'''


def chain_stage(count: int):
    """prefix-caching with one cost proof: a chain of `count` prompts from 240 tokens."""
    (stage,) = [s for s in load_stages() if s.slug == "prefix-caching"]
    (case,) = [c for c in stage.cases if c.check == "prefix_caching_cost"]
    inputs = {"prompt": {"random": 240 + count, "seed": 78}, "start": 240, "step": 1,
              "count": count, "floor_draw": {"prompt": {"random": [240 + count] * 2}}}
    return replace(stage, cases=(replace(case, inputs=inputs),), timeout=600)


def test_slow_reuse_that_reads_its_cache_passes_over_the_swap(tmp_path, weights, answers):
    """Catches a floor that still decides prefix-caching where the swap has proven reuse: this
    correct cache spends over its floor's budget and must pass, by its logits over the cache
    swapped after the first prompt."""
    course = make_course(tmp_path / "c", reference_text() + SLOW_PREFIX)
    stage = chain_stage(6)
    case = graded(course, weights, answers, stage)
    assert case.status == Status.PASSED, case.message
    assert case.message.startswith(FOLLOWED.split(":")[0]), case.message
    seconds, floor = (float(x) for x in re.findall(r"([\d.]+) s", case.message)[:2])
    assert seconds > float(stage.words["floor_fraction"]) * floor, (seconds, floor)


def test_only_a_chain_is_swapped_and_its_later_prompts_move(weights):
    """Catches a prefix swap whose answer a recompute gives (the later prompts' logits must
    depart from the original's) or one drawn where a reuse may read any of several earlier
    prompts (not a chain)."""
    from theinference.oracle.recompute import Recompute

    recompute = Recompute(weights.tensors, weights.config)
    ids = random_ids(40, 9, weights.config.vocab_size)
    assert pc.swap_after_first(recompute, [[ids[:20], ids[:10]]], 3) is None
    assert pc.swap_after_first(recompute, [[ids[:20], ids[:20]]], 3) is None
    plan = pc.swap_after_first(recompute, [[ids[:30], ids[:33], ids[:40]]], 3)
    plain = plan.plain()
    assert np.array_equal(plan.expected[0], plain[0])
    assert not np.allclose(plan.expected[1:], plain[1:], atol=1e-2, rtol=5e-2)


def test_a_chain_that_ignores_its_swapped_cache_is_named_a_recompute(weights):
    """Catches prefix-caching's "recomputes" verdict over the swap naming no bug: the report
    then named none, and the stage's later measured calls lost the CPU limit a decode shown
    to recompute keeps (a failing try ran to its end)."""
    verdict = judged_chain(weights, lambda plan: plan.plain())
    assert verdict.status == Status.FAILED, verdict.message
    assert verdict.suspected_bug == "decode-recomputes", verdict


def judged_chain(weights, answered):
    """The swapped chain's verdict (three prompts, each the one before and more) on the logits
    `answered(plan)` gives ([prompts, vocab]), each reusing all but its last new tokens."""
    from theinference.oracle.recompute import Recompute

    recompute = Recompute(weights.tensors, weights.config)
    ids = random_ids(40, 9, weights.config.vocab_size)
    args = [[ids[:30], ids[:33], ids[:40]]]
    plan = pc.swap_after_first(recompute, args, 3)
    plan.sent = True
    seen = Seen(plan, {"swap": {"applied": True}})
    pairs = [[row, np.array(n)] for row, n in zip(answered(plan), [0, 30, 33], strict=True)]
    original = pc.expect_prefix(recompute, args)  # [prompts, vocab]
    return pc.chain_over_swapped((pairs, None, seen), args, lambda _: original, TOL,
                                 weights.config)


def test_a_chain_whose_swap_landed_inside_its_first_prefill_is_judged_after_it(weights):
    """Catches a correct chain failed because its first prompt's logits are not the original's:
    a prefill that reads each layer's K/V back from the cache once written is swapped before
    its last layer's attention reads them (tests/test_cache_use.py), so its own logits move,
    while every later prompt follows the swapped cache. The first prompt's are its own then."""
    def first_moved(plan):  # the first prompt's logits read over the swap, the rest over it
        moved = plan.expected.copy()
        moved[0] = np.roll(moved[0], 1)
        return moved

    verdict = judged_chain(weights, first_moved)
    assert verdict.status == Status.PASSED, verdict.message


def test_a_chain_no_draw_of_which_moves_its_answers_is_not_swapped(weights, monkeypatch):
    """Catches a prefix swap kept when none of its draws moved the later prompts' logits: its
    expected answer is then the original's, and a decode that recomputes every prompt passed
    it as "the answer followed the cache". The floor judges such a case instead."""
    from theinference.oracle.recompute import Recompute

    monkeypatch.setattr(pc, "shuffled_cache", lambda kv, seed: list(kv))  # moves nothing
    recompute = Recompute(weights.tensors, weights.config)
    ids = random_ids(40, 9, weights.config.vocab_size)
    assert pc.swap_after_first(recompute, [[ids[:30], ids[:33], ids[:40]]], 3) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW_CACHES))
def test_the_slow_caches_pass_the_proofs_of_the_stages_a_floor_judged(
    name, tmp_path, weights, answers
):
    """Catches a correct cache failed for its cost: float64 at every use, and several common
    slownesses at once (tests/solutions/slow_caches.py), pass generate-loop's and
    prefix-caching's proofs by the swap."""
    course = make_course(tmp_path / "c", slow_cache(name))
    # 16 steps: the limit (0.6 of the floor, about 3.8 s here) holds twice the slownesses'
    # prefill, which before the swap costs 1.9 s of CPU (its unembedding copied and cast to
    # float64: half of it page faults); at 8, the limit met that prefill on a busy machine
    for stage in (cost_stage(16), chain_stage(16)):
        case = graded(course, weights, answers, stage)
        assert case.status == Status.PASSED, (stage.slug, case.message)
        assert case.message.startswith(FOLLOWED.split(":")[0]), case.message


# the reference's generate under a decorator whose wrapper is a library's (as torch.no_grad's),
# its prefill under another name (a function named prefill is a moment wherever it returns)
DECORATED = '''

import contextlib as _contextlib
import types as _types

_fill = _types.FunctionType(prefill.__code__.replace(co_name="fill", co_qualname="fill"),
                            globals())


class _quiet(_contextlib.ContextDecorator):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@_quiet()
def generate(prompt_ids, max_new_tokens, w):
    mc = ModelCache(n_layer(w), n_head(w))
    logits, out = _fill(prompt_ids, w, mc), []
    for step in range(max_new_tokens):
        out.append(int(np.argmax(logits)))
        if step + 1 < max_new_tokens:
            logits = decode_step(out[-1], len(prompt_ids) + step, w, mc)
    return out
'''


def test_a_prefill_below_a_decorated_course_function_is_swapped_after_it_returns(
    tmp_path, weights, answers
):
    """Catches a watch that loses the way to the adapter through a decorator's library frame
    (a generate under torch.no_grad): the prefill's return inside it must still be the moment,
    and the swap made there."""
    course = make_course(tmp_path / "c", reference_text() + DECORATED)
    case = graded(course, weights, answers, cost_stage(16))
    assert case.status == Status.PASSED, case.message
    assert case.message.startswith(FOLLOWED.split(":")[0]), case.message


def test_a_models_parameters_of_a_weights_shape_are_never_searched(weights, monkeypatch):
    """Catches a walk that sends a freshly built model's randomly initialised parameters (not
    yet the file's values, so not known as weights) to be searched: half a gigabyte, 20 s of
    the grader's search at the first moment of every measured call. A plain tensor of the
    same shape is still searched: a cache may be one."""
    import torch

    from theinference.student.worker.cache_walk import Walk, WeightSkip

    monkeypatch.setenv("THEINFERENCE_WEIGHTS", str(weights.path))
    parameter = torch.nn.Parameter(torch.randn(768, 2304))
    plain = torch.randn(768, 2304)
    walk = Walk(skip=WeightSkip(None))
    walk.visit({"model": [parameter], "cache": [plain]})
    held = [source.array for source in walk.sources]
    assert len(held) == 1 and np.shares_memory(held[0], plain.numpy()), walk.describe()


def test_a_pending_plan_answers_the_first_moment_from_its_sizes_and_waits_for_the_rest():
    """Catches a measured call held up at its first moment for a plan still being made (the
    adapter's own helpers return first: the overlap of the student's prefill with the oracle's
    forward is lost), sizes other than the plan's own, a word about what the process holds
    answered without the plan, and the plan not told what the call was told (its message on
    a swap never made would say no moment came)."""
    from theinference.curriculum.checks.swap import SwapPlan
    from theinference.grading.pending import NOT_DRAWN, PendingPlan
    from theinference.oracle.config import GPT2_124M
    from theinference.oracle.gpt2 import LayerKV

    kv = [LayerKV(np.ones((12, 7, 64), np.float32), np.ones((12, 7, 64), np.float32))] * 12
    plan = SwapPlan("prefill", 1, kv, kv, None, lambda: None, patience=4)
    made: list = []
    pending = PendingPlan(lambda: made[0], GPT2_124M, rows=7)
    first, _ = pending.answer({"call": 1})  # made is empty: a wait would raise here
    assert first == plan.answer({"call": 1})[0], "the sizes told are not the plan's"
    assert pending.answer({"call": 2})[0] == {"swap": None, "next": None}
    made.append((replace(plan, offered=False, calls=0), 1.5))
    held, _ = pending.answer({"held": [], "about": "nothing"})
    assert held["write"] is None and "rows" in held["reason"], held
    resolved, seconds = pending.resolve()
    assert seconds == 1.5 and resolved.offered and resolved.calls == 2
    nothing = PendingPlan(lambda: None, GPT2_124M, rows=7)
    nothing.answer({"call": 1})
    answer, _ = nothing.answer({"held": [], "about": "x"})
    assert answer == {"write": None, "reason": NOT_DRAWN, "stop": True}
    assert not nothing.sent and nothing.resolve() == (None, 0.0)


@pytest.mark.parametrize("tried_beside", [True, False])
def test_a_swapped_call_begins_before_its_plan_is_made_where_nothing_limits_it(
    tmp_path, weights, answers, monkeypatch, tried_beside
):
    """Catches a call that waits for its own swap plan to be made before it begins (the
    oracle's forward over the prompt and the student's prefill of it one after the other:
    prefix-caching's save cost both), a swap lost when the plan comes only once the call has
    begun, and a measured call begun beside its plan where the floor has little room (a slow
    but correct cache near its limit was stopped there under CI's load: measured.room_beside).
    Tried beside first (swap_first.py), the call has no limit and never waits; measured alone
    (as where a decode ignored its swap), only where its floor holds 16 prefills."""
    from theinference.grading import ahead, grader, swap_first

    # an oracle slower than the student's prefill of 240 tokens
    made_at, began_at = slowed_plans(monkeypatch, "run_generate", 1.5)
    if not tried_beside:
        for module in (ahead, grader, swap_first):
            monkeypatch.setattr(module, "tries_beside", lambda case, config: False)
    course = make_course(tmp_path / "c", reference_text())
    for new_tokens, beside in ((20, True), (8, tried_beside)):  # a recompute: 20 or 8 prefills
        made_at.clear()
        began_at.clear()
        case = graded(course, weights, answers, cost_stage(new_tokens))
        assert case.status == Status.PASSED, case.message
        assert case.message.startswith(FOLLOWED.split(":")[0]), case.message
        assert began_at and made_at and (began_at[0] < made_at[0]) == beside, new_tokens
