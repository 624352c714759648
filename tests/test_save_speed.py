"""What keeps a save fast, held as behaviour (its figures are benchmarks/save_speed.py's):
the oracle keeps what depends on the weights and a fixed prompt, the worker searches the
student's memory no more than it must, and a failing stage asks again only what its diagnosis
reads."""

import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from tests.bugs import planted
from tests.helpers import grader_exchange, make_course, sizes
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.checks.swap import after_prefill, prompt_state
from theinference.curriculum.stages import load_stages, select, with_run_draws
from theinference.grading import answer_cache
from theinference.grading.ahead import drawn_stages, plan_ahead, runs_alone
from theinference.grading.answers import Answers
from theinference.grading.grader import RunPlan, grade
from theinference.grading.judging import UNASKED, kept_prompts
from theinference.grading.own_cache import wanted_again
from theinference.grading.policy import RunPolicy
from theinference.grading.policy import plan as plan_cases
from theinference.oracle.gpt2 import LayerKV
from theinference.results import Status
from theinference.student.setup import Limits, ProcessSetup
from theinference.student.worker import swap as worker_swap

H, N, HD = 2, 5, 64


def rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((H, N, HD)).astype(np.float32)


def test_a_large_array_with_no_kv_is_sent_again_only_when_its_bytes_change():
    """Catches a copy of all the student's reachable memory to the grader at every moment (a
    model loader that returns into the adapter a hundred times over weights the grader does not
    recognise never got an answer), and a memo that would skip an array once it has changed."""
    k, v = rows(0), rows(1)
    finds, writes = [LayerKV(k, v)], [LayerKV(rows(2), rows(3))]
    sent: list[int] = []
    target = worker_swap.Target(sizes(finds), grader_exchange(finds, writes, sent))
    loader = np.random.default_rng(9).standard_normal((300, 768)).astype(np.float32)  # no K/V
    assert not target.swap([loader], None)["applied"]
    assert not target.swap([loader], None)["applied"]
    assert sent == [loader.size], "an unchanged array with no row was sent again"
    loader[299, 767] += 1.0
    assert not target.swap([loader], None)["applied"]
    assert sent == [loader.size] * 2, "an array whose bytes changed was not sent again"
    cache = {"k": k.copy(), "v": v.copy()}
    assert target.swap([loader, cache], None)["applied"]
    np.testing.assert_array_equal(cache["k"], rows(2))
    assert sent[2:] == [k.size, v.size], "the unchanged loader was sent beside the cache"

def test_a_half_built_cache_is_not_sent_again_until_it_changes():
    """Catches a cache the grader has searched, found part of the K/V in, and is sent again at
    every later moment though nothing in it changed (a cache kept at module level, watched
    through a prefill by another name: once per helper's return, each a search of all of it)."""
    k, v = rows(0), rows(1)
    finds, writes = [LayerKV(k, v)], [LayerKV(rows(2), rows(3))]
    sent: list[int] = []
    target = worker_swap.Target(sizes(finds), grader_exchange(finds, writes, sent))
    half = {"k": k.copy(), "v": v.copy()}
    half["v"][:, -1] = 0.0  # the last position's V not written yet
    assert not target.swap([half], None)["applied"]
    assert not target.swap([half], None)["applied"]
    assert sent == [k.size, v.size], "an unchanged cache was searched again"
    half["v"][:, -1] = v[:, -1]
    assert target.swap([half], None)["applied"]
    np.testing.assert_array_equal(half["v"], rows(3))


def test_an_unchanged_array_with_rows_in_it_is_named_not_sent_and_still_written():
    """Catches an array the grader found K/V rows in sent and searched again at every later
    moment though unchanged (a pool allocated whole, filled a layer at a time, copied to the
    grader at every return of the prefill), and a memo that forgets where the rows were: the
    swap must still write them once the rest of the K/V is there."""
    k, v = rows(0), rows(1)
    finds, writes = [LayerKV(k, v)], [LayerKV(rows(2), rows(3))]
    sent: list[int] = []
    target = worker_swap.Target(sizes(finds), grader_exchange(finds, writes, sent))
    keys, values = k.copy(), np.zeros_like(v)
    values[:, :2] = v[:, :2]  # the V half written: K is all there, V not yet
    assert not target.swap([{"k": keys, "v": values}], None)["applied"]
    values[:, 2:] = v[:, 2:]
    assert target.swap([{"k": keys, "v": values}], None)["applied"]
    assert sent == [k.size, v.size, v.size], "the unchanged K was sent again"
    np.testing.assert_array_equal(keys, rows(2))
    np.testing.assert_array_equal(values, rows(3))


def test_arrays_of_one_sign_are_not_sent_once_the_grader_says_they_hold_no_row():
    """Catches attention probabilities ([heads, n, n], all >= 0: the largest arrays a prefill
    makes, new at every layer) sent and searched at each layer of a prefill into a pool
    allocated whole; and a worker that skips them before the grader has said that no K/V row
    is of one sign, or skips an array of both signs."""
    k, v = rows(0), rows(1)
    finds, writes = [LayerKV(k, v)], [LayerKV(rows(2), rows(3))]
    sent: list[int] = []
    target = worker_swap.Target(sizes(finds), grader_exchange(finds, writes, sent))
    keys, values = k.copy(), np.zeros_like(v)  # K kept: named, not sent, at the next moment
    probabilities = np.random.default_rng(7).random((H, 256, 256)).astype(np.float32)
    assert not target.swap([{"k": keys, "v": values}, probabilities], None)["applied"]
    assert sorted(sent) == sorted([k.size, probabilities.size]), "sent before the grader said"
    cache = {"k": keys, "v": v.copy()}
    scores = probabilities - 0.5  # of both signs: may hold rows, sent
    assert target.swap([cache, probabilities * 2, -probabilities, scores], None)["applied"]
    assert sorted(sent[2:]) == sorted([v.size, scores.size]), "an array of one sign was sent"
    np.testing.assert_array_equal(cache["v"], rows(3))


def test_a_cache_whose_rows_are_of_one_sign_is_still_found():
    """Catches arrays of one sign skipped where a K/V row is of one sign (no real model's, but
    the skip rests on the targets, not on models): the grader then says nothing of signs, and
    searches such an array."""
    from theinference.curriculum.checks.swap_search import Search

    k, v = np.abs(rows(0)), rows(1)
    assert not Search([LayerKV(k, v)], [LayerKV(k, v)]).one_signed_barren
    finds, writes = [LayerKV(k, v)], [LayerKV(rows(2), rows(3))]
    cache = {"k": k.copy(), "v": v.copy()}
    target = worker_swap.Target(sizes(finds), grader_exchange(finds, writes))
    assert target.swap([cache], None)["applied"]
    np.testing.assert_array_equal(cache["k"], rows(2))


def test_an_arena_read_along_its_last_axis_is_not_gathered_along_the_other_once_found(
    monkeypatch,
):
    """Catches a merged-heads arena ([positions, heads * 64], every layer's K and V in it)
    gathered and matched along its first axis too after its rows were found along its last
    (75 MB gathered twice at every swap: full-decode-step on the arena layout took 1.85x its
    own work)."""
    from theinference.curriculum.checks import swap_search
    from theinference.student.reply_arrays import Sent

    k, v = rows(0), rows(1)  # [H, N, HD]
    arena = np.zeros((128, H * HD), dtype=np.float32)  # K at positions 0.., V at 64..
    arena[:N] = k.transpose(1, 0, 2).reshape(N, -1)
    arena[64 : 64 + N] = v.transpose(1, 0, 2).reshape(N, -1)
    search = swap_search.Search([LayerKV(k, v)], [LayerKV(rows(2), rows(3))])
    matched: list[int] = []
    match = type(search.index).match
    monkeypatch.setattr(type(search.index), "match",
                        lambda index, rows_: matched.append(len(rows_)) or match(index, rows_))
    answer, _ = search.answer([Sent(arena, False, None)], "an arena")
    assert answer["write"] is not None, answer["reason"]
    assert matched == [128 * H], f"views matched after the rows were found: {matched}"


def test_rows_along_two_axes_of_one_array_are_all_found():
    """Catches a search of an array that stops at the first view holding K/V rows though the
    array holds values that view's rows do not (here the V rows, kept a column each)."""
    from theinference.curriculum.checks.swap_search import Search
    from theinference.student.reply_arrays import Sent

    k, v = rows(0), rows(1)
    both = np.zeros((128, 128), dtype=np.float32)
    both[: H * N, :HD] = k.reshape(-1, HD)  # K rows along the last axis
    both[64:, HD : HD + H * N] = v.reshape(-1, HD).T  # V rows down the first
    answer, _ = Search([LayerKV(k, v)], [LayerKV(rows(2), rows(3))]).answer(
        [Sent(both, False, None)], "K one way, V the other")
    assert answer["write"] is not None, answer["reason"]


def test_a_swap_writes_only_the_rows_it_changes():
    """Catches a swap that writes back every K/V row found, the layers it leaves as they are
    included (a full 1000-token arena's 75 MB sent back and written at every swap, where the
    drawn layers are a few), and one that leaves a changed row unwritten: the layer left keeps
    its own values to the bit (here keys kept pre-scaled by 0.3), the other takes the new."""
    kept, changed = LayerKV(rows(0), rows(1)), LayerKV(rows(2), rows(3))
    finds, writes = [kept, changed], [kept, LayerKV(rows(4), rows(5))]
    cache = [{"k": 0.3 * layer.k, "v": layer.v.copy()} for layer in finds]
    report = worker_swap.Target(sizes(finds), grader_exchange(finds, writes)).swap([cache], None)
    assert report["applied"] and report["places"] == 2, report  # layer 1's K and V alone
    np.testing.assert_array_equal(cache[0]["k"], (0.3 * rows(0)).astype(np.float32))
    np.testing.assert_allclose(cache[1]["k"], 0.3 * rows(4), rtol=1e-5)
    np.testing.assert_array_equal(cache[1]["v"], rows(5))


def test_an_array_called_known_that_was_never_searched_is_a_bad_reply_not_a_write():
    """Catches a memo that trusts the student's process: a number the grader never found rows
    under (or one that is no count) must fail the search with a message, never write or take
    rows from another call's search."""
    from theinference.curriculum.checks.swap_search import Search
    from theinference.student.reply_arrays import BadReply, Blobs, Known, held_arrays

    finds = [LayerKV(rows(0), rows(1))]
    with pytest.raises(BadReply, match="never searched"):
        Search(finds, finds).answer([Known(3)], "what was sent")
    for word in ({"known": -1}, {"known": "0"}, {"known": True}):
        with pytest.raises(BadReply, match="not a count"):
            held_arrays([word], Blobs([]))


def test_the_sieve_drops_no_row_the_search_would_match(monkeypatch):
    """Catches a sieve (row_index.Sieve: a row's first values looked up among the targets'
    cells, before the grid's pairs) that drops a row within tolerance of a target: rows moved
    off their targets by up to the loose tolerance in every value, each exactly so in one,
    beside rows of arrays that are no cache, must match as they do with no sieve at all."""
    from theinference.student import row_index

    rng = np.random.default_rng(11)

    def unit(a):
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)

    monkeypatch.setattr(row_index, "SIEVE_AFTER", 0)  # sieved from the first row
    targets = unit(rng.standard_normal((20000, HD)))
    index = row_index.RowIndex(targets)
    tol = row_index.TOL
    moved = targets[:4000] + rng.uniform(-tol, tol, (4000, HD)).astype(np.float32) * 0.9
    moved[np.arange(4000), rng.integers(0, 8, 4000)] += tol * 0.98  # at the edge in one value
    scores = np.exp(rng.standard_normal((8000, HD))).astype(np.float32)  # softmax-like rows
    queries = np.concatenate([moved * 3.5, scores, unit(rng.standard_normal((8000, HD)))])
    sieved = index.match(queries)
    monkeypatch.setattr(index.sieve, "passes", lambda units: np.ones(len(units), dtype=bool))
    whole = index.match(queries)
    for mine, theirs in zip(sieved, whole, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert len(np.intersect1d(sieved[0], np.arange(4000))) > 1500, "too few rows near the edge"


def test_a_rows_own_cell_first_finds_what_the_eight_cells_around_it_find():
    """Catches the search's shortcut (a row's own grid cell first, cache_rows.RowIndex.nearest)
    answering otherwise than comparing every row with the 8 cells around it: a row whose best
    target lies across its cell's face matched to a worse one inside, or a row with a second
    target nearly as near across the face (ambiguous: never written) matched all the same."""
    from theinference.student import row_index as cache_rows

    rng = np.random.default_rng(5)
    tol = cache_rows.PASSES[0]
    cell = 2 * tol

    def unit(a):
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)

    def beside(q, first: float, spread: float):  # q moved: its first value by `first`
        d = rng.uniform(-spread, spread, q.shape)
        d[:, 0] = first
        return unit(q + d)

    q = unit(rng.standard_normal((400, HD)))  # [Q, hd]
    q[:, 0] = (np.floor(q[:, 0] / cell) + 0.05) * cell  # just inside its cell's lower face
    q = q.astype(np.float32)
    best_across = beside(q[:200], -2e-5, 1e-6)  # the best target, across the face
    worse_inside = beside(q[:200], 1e-5, 9.5e-5)  # within tolerance, in the row's own cell
    near_inside = beside(q[200:], 5e-6, 1e-5)  # best in its own cell ...
    near_across = beside(q[200:], -1.6e-5, 1e-5)  # ... and another as near, but for 1.6x
    others = unit(rng.standard_normal((3000, HD)))
    targets = np.concatenate([best_across, worse_inside, near_inside, near_across, others])
    index = cache_rows.RowIndex(targets)
    units = np.concatenate([q, others[:1000], unit(rng.standard_normal((1000, HD)))])
    live = np.arange(len(units))
    for tol in cache_rows.PASSES:
        got = index.nearest(units, live, tol)
        whole = index.clear(units, *index.grids[tol].pairs(units[:, :3], live), tol)[:2]
        for mine, theirs in zip(got, whole, strict=True):
            np.testing.assert_array_equal(mine, theirs)
    rows, found = index.nearest(units, live, cache_rows.PASSES[0])
    assert rows[:200].tolist() == found[:200].tolist() == list(range(200)), "best across"
    assert not set(rows) & set(range(200, 400)), "an ambiguous row was matched"


def test_a_cache_preallocated_with_zeros_is_sent_only_once_written():
    """Catches zeros sent to be searched (a cache preallocated whole before its prefill cost
    the grader a search at every return, and one more of every array in shuffled orders: 63
    searches of 10 M rows on a float64 solution's decode stage, 11 once zeros were not sent),
    and zeros kept as seen after the prefill writes the K/V into them."""
    k, v = rows(0), rows(1)
    finds, writes = [LayerKV(k, v)], [LayerKV(rows(2), rows(3))]
    sent: list[int] = []
    target = worker_swap.Target(sizes(finds), grader_exchange(finds, writes, sent))
    pool = np.zeros((2, H, 16, HD))  # float64, room for 16 positions
    assert not target.swap([pool], None)["applied"]
    assert sent == [], "an array of zeros was sent"
    pool[0, :, :N], pool[1, :, :N] = k, v  # the prefill writes the prompt's K/V
    assert target.swap([pool], None)["applied"]
    assert sent == [pool.size], "the written pool was not sent"
    np.testing.assert_allclose(pool[0, :, :N], rows(2), rtol=1e-6)



def drawn_and_longest(slug: str, config) -> tuple[list[int], list[int]]:
    (stage,) = select(load_stages(), [slug])
    drawn = with_run_draws(stage, seed=12345)
    case = next(c for c in drawn.cases if "drawn" in c.inputs)
    return CHECKS[case.check].arguments(case, config)[0], kept_prompts(drawn, config)[0]


@pytest.mark.parametrize("slug", ["full-decode-step", "per-step-identity"])
def test_a_drawn_decode_proof_begins_the_prompt_whose_kv_are_kept(slug, weights):
    """Catches a drawn proof whose prompt is new every run: the oracle would run a forward
    over it at every save instead of a few decodes over kept K/V."""
    prompt, longest = drawn_and_longest(slug, weights.config)
    assert 1 <= len(prompt) <= len(longest) and longest[: len(prompt)] == prompt


def test_a_run_given_its_seed_keeps_its_drawn_prompts_kv_and_a_fresh_seeds_run_does_not(
    template_course, weights
):
    """Catches a drawn proof's prompt computed again by every run given the same seed (a class
    graded with one seed: a forward over a thousand tokens for each submission), and a fresh
    seed's prompts (none given, or a watch's drawn for its next run) kept in the answer cache,
    where no run will ever ask for them again."""
    (stage,) = select(load_stages(), ["full-decode-step"])
    proof = replace(stage, cases=tuple(c for c in stage.cases if "draw" in c.inputs))
    assert proof.cases  # the stage's drawn cache-use proof alone: no fixed prompt to begin
    for seed, fresh in ((12345, False), (None, False), (12345, True)):
        answers = Answers(weights)
        grade(ProcessSetup(template_course, weights.path),
              RunPlan([proof], weights, answers, seed=seed, fresh_seed=fresh))
        if seed is None or fresh:
            assert answers.bases == []
            continue
        (case,) = with_run_draws(proof, seed).cases
        check = CHECKS[case.check]
        assert answers.bases == [check.kept_prompt(check.arguments(case, weights.config))]


def test_a_swap_over_kept_kv_is_the_swap_over_a_fresh_forward(weights, tmp_path, monkeypatch):
    """Catches kept K/V sliced or decoded wrong (a verdict would then change with the cache's
    state), and a kept prompt that is computed again in a later process."""
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path))
    prompt, longest = drawn_and_longest("full-decode-step", weights.config)
    answers = Answers.cached(weights)
    answers.bases = [longest]
    kept = after_prefill(answers.recompute, prompt, [318], 7, answers.prompt_state)
    fresh = after_prefill(answers.recompute, prompt, [318], 7, prompt_state)
    for a, b in zip(kept.finds, fresh.finds, strict=True):
        np.testing.assert_allclose(a.k, b.k, atol=1e-4, rtol=1e-4)  # a forward's length
        np.testing.assert_allclose(a.v, b.v, atol=1e-4, rtol=1e-4)  # changes its blocking
    np.testing.assert_allclose(kept.expected, fresh.expected, atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(kept.plain(), fresh.plain(), atol=1e-3, rtol=1e-3)

    later = Answers.cached(weights)  # another process's: the K/V come from the disk
    later.bases = [longest]
    monkeypatch.setattr(later.recompute, "forward", lambda ids: pytest.fail("a forward again"))
    again = after_prefill(later.recompute, prompt, [318], 7, later.prompt_state)
    np.testing.assert_allclose(again.expected, kept.expected, atol=1e-6)


def test_the_answers_on_disk_keep_their_bound_least_recently_used_first(tmp_path, monkeypatch):
    """Catches an answer cache that grows without end (a long prompt's K/V is 75 MB), and one
    that evicts what was just used."""
    monkeypatch.setenv(answer_cache.DISK_MB_VAR, "1")
    cache = answer_cache.AnswerCache("ab" * 32, tmp_path)
    block = np.zeros(60_000, dtype=np.float32)  # 240 kB an answer
    for i in range(6):
        time.sleep(0.01)  # apart on any file system's clock
        cache.get_or_compute("c", [i], lambda: block)
        if i == 2:  # answer 0 used again, from the disk (a fresh cache has no memory of it)
            fresh = answer_cache.AnswerCache("ab" * 32, tmp_path)
            fresh.get_or_compute("c", [0], lambda: pytest.fail("answer 0 was evicted early"))
    held = sum(p.stat().st_size for p in cache.directory.glob("*.answer"))
    assert held <= 1 << 20
    assert cache._load(cache.key("c", [0])) is not None, "the answer used last was evicted"
    assert cache._load(cache.key("c", [1])) is None


def test_a_failing_stage_asks_again_only_what_its_diagnosis_reads(tmp_path, weights, answers):
    """Catches a failing try that asks every departing case again over the student's own
    cache (a failing save cost more than a passing one), one that goes on asking once the
    catalogue has named the bug on the first two, and a limit that costs the stage its
    diagnosis."""
    course = make_course(tmp_path / "course", planted("decode-position-zero"))
    (stage,) = select(load_stages(), ["full-decode-step"])
    chosen = ("one-token", "token ids", "short prompt", "repeated", "(1023)")
    setup = ProcessSetup(course, weights.path, Limits(timeout=120))
    run = grade(setup, RunPlan([replace(stage, timeout=120)], weights, answers,
                               policy=RunPolicy(cases=chosen)))
    (result,) = run.stages
    assert result.status == Status.FAILED and result.suspected_bug == "position-zero"
    unasked = [c.name for c in result.cases if c.message.startswith(UNASKED.split("{")[0])]
    # the first two asked again (the catalogue confirms a bug on two), then no more: it
    # names position-zero alone on them
    assert len(result.cases) == 5 and unasked == [c.name for c in result.cases[2:]], unasked


def test_a_long_case_beside_the_small_ones_is_asked_again_only_if_still_wanted(
        tmp_path, weights, answers):
    """Catches whether to ask a departing answer again decided when its case began: in a run
    whose cases go beside each other, the long case begins with the stage's first cases and
    was asked again (a failing try cost a long case twice: full-decode-step's failing save
    1.04x -> 1.25x of the student's own work); decided when it departs, the small ones have
    failed by then."""
    course = make_course(tmp_path / "course", planted("decode-position-zero"))
    (stage,) = select(load_stages(), ["full-decode-step"])
    chosen = ("one-token", "token ids", "short prompt", "repeated", "(1023)")
    setup = ProcessSetup(course, weights.path, Limits(timeout=120))
    run = grade(setup, RunPlan([replace(stage, timeout=120)], weights, answers,
                               policy=RunPolicy(cases=chosen), jobs=2))
    (result,) = run.stages
    assert result.status == Status.FAILED and result.suspected_bug == "position-zero"
    (long,) = [c for c in result.cases if "(1023)" in c.name]
    assert long.message.startswith(UNASKED.split("{")[0]), long.message


def test_asking_again_stops_when_the_catalogue_has_named_one_bug():
    """Catches asking again past the first two failing answers once one bug explains them
    (the failing try pays a case twice for nothing), and stopping while candidates are left to
    tell apart (the diagnosis would lose them) or asking a long case past the first two."""
    (stage,) = select(load_stages(), ["full-decode-step"])
    small = next(c for c in stage.cases if c.name.startswith("one-token"))
    long = next(c for c in stage.cases if "(1023)" in c.name)
    named, open_question = (lambda: True), (lambda: False)
    assert wanted_again(small, 0, named) and wanted_again(small, 1, named)
    assert not wanted_again(small, 2, named)
    assert wanted_again(small, 2, open_question) and wanted_again(small, 3, open_question)
    assert not wanted_again(small, 4, open_question)
    assert wanted_again(long, 1, open_question) and not wanted_again(long, 2, open_question)


def test_the_grader_runs_its_blas_on_one_thread_unless_told_otherwise():
    """Catches a grader whose BLAS threads spin against the student's process for the cores
    (several times slower on a loaded 2-core machine), and one that overrides a class job's
    share."""
    code = ("from theinference.cli import one_blas_thread; import os; one_blas_thread(); "
            "print(os.environ['OPENBLAS_NUM_THREADS'])")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    said = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert said.stdout.strip() == "1"
    said = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "2"},
                          capture_output=True, text=True)
    assert said.stdout.strip() == "2"


class Slow:
    """A stand-in student process: records which cases it served and when."""

    def __init__(self, log: list):
        self.log = log

    def serve(self, case) -> str:
        started = time.monotonic()
        time.sleep(0.3)
        self.log.append((case.name, id(self), started, time.monotonic()))
        return case.name.upper()


def test_long_cases_run_beside_each_other_and_report_in_order():
    """Catches long cases still run one after another with --jobs 2 (a stage's wall time the
    sum of its cases'), results out of the cases' order, and a grader fault in a thread lost
    rather than raised."""
    import threading

    from theinference.curriculum.stages import Case
    from theinference.grading.beside import grade_beside

    log: list = []
    workers = [Slow(log), Slow(log)]
    cases = [Case(name, "step_attention", {"seq": list(range(400))}) for name in "abcd"]
    out = grade_beside(cases, workers, lambda case, w: w.serve(case), threading.Event())
    assert out == ["A", "B", "C", "D"]
    assert {served for _, served, _, _ in log} == {id(w) for w in workers}
    (_, _, start_a, end_a), (_, _, start_b, end_b) = sorted(log, key=lambda r: r[2])[:2]
    assert start_b < end_a and start_a < end_b, "the first two cases did not overlap"

    def broken(case, worker):
        raise RuntimeError("a grader fault")

    with pytest.raises(RuntimeError, match="a grader fault"):
        grade_beside(cases, workers, broken, threading.Event())


def test_the_processes_beside_the_first_are_started_by_a_thread_that_outlives_each_stage(
        monkeypatch):
    """Catches a process beside the first started by a thread that ends with a stage's long
    cases: it dies with that thread (bubblewrap's --die-with-parent, the worker's parent-death
    signal), and every later stage paid its start-up again (a whole course: 11 starts, not 7);
    and one started after the stage's small cases rather than while they run."""
    import threading

    from theinference.grading import beside
    from theinference.grading.beside import Workers

    class Starting:
        def __init__(self, setup):
            self.started_by: list = []

        def start(self):
            self.started_by.append(threading.current_thread())

        def use_limits(self, limits):
            pass

        def close(self):
            pass

    monkeypatch.setattr(beside, "AheadProcess", Starting)
    with Workers(None, jobs=2) as workers:
        workers.start_first(Limits())
        workers.start_ahead(3, Limits())
        workers.started()
        first, second = workers.processes
        assert second.started_by and second.started_by[0] is not threading.current_thread()
        assert workers.at_most(2, Limits())[1] is second
        workers.wait_for(second)  # its own start, asked of the starter
        assert second.started_by
        assert all(thread.is_alive() for thread in first.started_by + second.started_by)


def test_a_process_still_starting_is_not_asked_again_before_the_first_takes_a_case(monkeypatch):
    """Catches the batch after a stage's first case asking again for the process that
    start_beside has just asked to start, with the same limits: asking waits for every start
    under way, so the first process waited for the second's start (0.1 to 0.2 s of each
    single-step save) before its next small case."""
    import threading

    from theinference.grading import beside
    from theinference.grading.beside import Workers

    release = threading.Event()

    class Slow:
        def __init__(self, setup):
            self.limits = None

        def start(self):
            release.wait(timeout=30)

        def use_limits(self, limits):
            self.limits = limits

        def close(self):
            pass

    monkeypatch.setattr(beside, "AheadProcess", Slow)
    with Workers(None, jobs=2) as workers:
        workers.start_ahead(2, Limits())  # start_beside, after the first case
        asked = threading.Thread(target=workers.at_most, args=(2, Limits()))  # the batch
        asked.start()
        asked.join(timeout=10)
        stuck = asked.is_alive()
        release.set()
        assert not stuck, "the batch waited for the start it had already asked for"


def test_a_stage_whose_first_case_is_todo_starts_no_process_beside(template_course, weights):
    """Catches a course of stubs paying a second process's start-up at every stage: the
    processes beside the first are started once a stage has begun (its first case not todo)."""
    (stage,) = select(load_stages(), ["single-step-attention"])
    setup = ProcessSetup(template_course, weights.path)
    run = grade(setup, RunPlan([stage], weights, jobs=2))
    assert run.stages[0].status == Status.TODO and run.worker_startups == 1


def test_only_long_unmeasured_cases_and_swapped_measured_ones_go_beside(weights):
    """Catches a measured call with no swap (its floor the only evidence) run beside another
    case, where its CPU and rate would no longer be its own; a measured case whose cache is
    swapped kept alone, where its swap, evidence wherever it runs, is tried beside first
    (swap_first.py); and short cases taken off the one process."""
    from theinference.grading.beside import goes_beside

    stages = {s.slug: with_run_draws(s, 1) for s in load_stages()}
    beside = {slug: [c.name for c in s.cases if goes_beside(c, weights.config)]
              for slug, s in stages.items()}
    assert "decode at the last position the context allows (1023)" in beside["full-decode-step"]
    assert "to the last position the context allows (1023)" in beside["per-step-identity"]
    assert beside["generate-loop"] == ["up to the end of the context (1000 + 24 tokens)",
                                       "each token comes from the cache (CPU time against a "
                                       "recompute's arithmetic)"]
    assert beside["prefix-caching"] == ["reuse is real (CPU time of 32 growing prompts against "
                                        "a recompute's arithmetic)"]
    assert not any("one-token" in name for names in beside.values() for name in names)
    shared = stages["prefix-caching"].cases[1]  # its check measures, and swaps nothing
    prompts = [[{"random": 900, "seed": 1}, {"random": 1, "seed": s}] for s in range(2, 18)]
    long = replace(shared, inputs={**shared.inputs, "prompts": prompts})
    assert runs_alone(long, weights.config) and not goes_beside(long, weights.config)


def test_a_full_runs_unmeasured_cases_go_beside_each_other_and_a_watchs_long_ones_only(
        weights):
    """Catches a full run's small cases graded one after another on one process while the
    second idles (generate-loop's cost the stage their sum), a measured call or a refusal
    swept in among them (its CPU and rate would no longer be its own), the stage's first case
    not alone (a stage of stubs is told todo by it), and a watch run's small cases (which stop
    at its first failure) taken otherwise than one by one, smallest first."""
    from theinference.grading.ahead import runs_alone
    from theinference.grading.beside import beside_count

    config = weights.config
    (stage,) = select(load_stages(), ["generate-loop"])
    cases = list(plan_cases(with_run_draws(stage, 1), RunPolicy()).cases)
    alone = [runs_alone(case, config) for case in cases]
    first_alone = alone.index(True)
    assert beside_count(cases, 1, config, 2, stops_early=False) == first_alone - 1 >= 3
    assert beside_count(cases, first_alone, config, 2, stops_early=False) == 0
    assert beside_count(cases, 0, config, 2, stops_early=False) == 0
    assert beside_count(cases, 1, config, 2, stops_early=True) == 0
    assert beside_count(cases, 1, config, 1, stops_early=False) == 0


def test_swap_plans_made_ahead_are_the_runs_own_and_handed_out_once(weights, answers):
    """Catches a swap plan made ahead (watch mode, between runs) for other arguments or another
    swap than the run draws, which would judge the call against a cache it never held, and a
    plan handed out twice or with its hook already heard (it would never swap again)."""
    import threading

    (stage,) = select(load_stages(), ["full-decode-step"])
    policy = RunPolicy(quick=True)
    made = plan_ahead([stage], answers, policy, 4242, threading.Event())
    (drawn,) = drawn_stages([stage], policy, 4242)
    swapped = [c for c in plan_cases(drawn, policy).cases if CHECKS[c.check].swap is not None]
    assert made == len(swapped) >= 2
    for stored, _ in answers.ahead.values():  # as if a call had heard its hook
        stored.calls, stored.offered = 1, True
    for case in swapped:
        check = CHECKS[case.check]
        args, seed = check.arguments(case, weights.config), int(case.inputs["swap"])
        kept, seconds = answers.planned(case.check, args, seed)
        assert (kept.calls, kept.offered) == (0, False) and seconds > 0
        fresh = check.swap(answers.recompute, args, seed, answers.prompt_state)
        np.testing.assert_array_equal(kept.expected, fresh.expected)
        for a, b in zip(kept.writes, fresh.writes, strict=True):
            np.testing.assert_array_equal(a.k, b.k)
            np.testing.assert_array_equal(a.v, b.v)
        assert answers.planned(case.check, args, seed) is None, "a plan was handed out twice"
    stopped = threading.Event()
    stopped.set()
    assert plan_ahead([stage], answers, policy, 4243, stopped) == 0 and not answers.ahead


def test_a_stages_first_failing_case_is_shown_once_before_its_stage_ends():
    """Catches a failing case kept off the screen until its stage's long cases are done (the
    first failing verdict then waits on the slowest case), a passing case shown early, and
    the early line repeated for every later failing case of the stage."""
    from theinference.output.report import early_failure
    from theinference.results import CaseResult

    shown: set[str] = set()
    passing = CaseResult(name="one-token prompt", status=Status.PASSED)
    failing = CaseResult(name="short prompt", status=Status.FAILED, message="logits differ\nmore")
    assert early_failure("full-decode-step", passing, shown) is None
    line = early_failure("full-decode-step", failing, shown).plain
    assert "full-decode-step" in line and "short prompt" in line and "FAILED" in line
    assert "logits differ" in line and "more" not in line and "running" in line
    assert early_failure("full-decode-step", replace(failing, name="repeated"), shown) is None
    assert early_failure("build-prefill", failing, shown) is not None


def test_a_stages_swap_plans_are_made_in_a_thread_and_each_case_waits_for_its_own(
        answers, weights, monkeypatch):
    """Catches a case judged without its plan while the planner thread is still making it
    (made twice, or the case judged against nothing), a plan made on the grading thread after
    all (no time saved), and a stopped planner leaving a case waiting for ever."""
    import threading

    from theinference.curriculum.checks.swap import SwapPlan
    from theinference.grading.ahead import Planner

    made_on = []

    def swap(recompute, args, seed, state):
        made_on.append(threading.current_thread().name)
        time.sleep(0.05)
        return SwapPlan("prefill", 1, [], [], np.asarray([len(args[0])]), lambda: None)

    for name in ("decode_step", "decode_cache_use"):
        monkeypatch.setitem(CHECKS, name, replace(CHECKS[name], swap=swap))
    (stage,) = drawn_stages(select(load_stages(), ["full-decode-step"]), RunPolicy(), 7)
    cases = plan_cases(stage, RunPolicy()).cases
    planner = Planner(cases, answers, threading.Event()).start()
    for case in cases:
        args = CHECKS[case.check].arguments(case, weights.config)
        plan, seconds = answers.planned(case.check, args, int(case.inputs["swap"]))
        assert plan.expected[0] == len(args[0]) and seconds >= 0.05
    planner.close()
    assert len(made_on) == len(cases) and threading.current_thread().name not in made_on
    stopped = threading.Event()
    stopped.set()
    Planner(cases, answers, stopped).start().done()
    args = CHECKS[cases[0].check].arguments(cases[0], weights.config)
    assert answers.planned(cases[0].check, args, int(cases[0].inputs["swap"])) is None


def test_no_plan_is_made_beside_a_run_whose_blas_has_threads(weights, answers, monkeypatch):
    """Catches the planner's thread (or a long case's) started where the grader's OpenBLAS has
    threads of its own, as a class job's `theinference test` has: OpenBLAS's handler before a
    fork joins its threads, so a student process started while the planner was inside it hung
    the grader for good. Each case then makes its own plan, waiting for none."""
    import threading

    from theinference.grading.ahead import Planner
    from theinference.grading.beside import goes_beside
    from theinference.grading.environment import blas_is_one_thread

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert not blas_is_one_thread()
    (stage,) = drawn_stages(select(load_stages(), ["full-decode-step"]), RunPolicy(), 7)
    cases = plan_cases(stage, RunPolicy()).cases
    planner = Planner(cases, answers, threading.Event()).start()
    assert not planner.thread.is_alive() and not answers.making
    args = CHECKS[cases[0].check].arguments(cases[0], weights.config)
    assert answers.planned(cases[0].check, args, int(cases[0].inputs["swap"])) is None
    assert not any(goes_beside(case, weights.config) for case in cases)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert blas_is_one_thread() and any(goes_beside(case, weights.config) for case in cases)


def test_blas_loaded_with_threads_before_the_variable_was_set_is_seen():
    """Catches the planner's thread started where NumPy loaded its OpenBLAS with threads before
    OPENBLAS_NUM_THREADS=1 was set (a script or notebook importing the grader after NumPy):
    the variable then says one thread, the library runs two, and a student process started
    while the planner was inside OpenBLAS hung the grader (seen with a wrapper script)."""
    import subprocess
    import sys

    probe = ("import os, numpy; os.environ['OPENBLAS_NUM_THREADS'] = '1'; "
             "from theinference.grading.environment import blas_is_one_thread, openblas_threads; "
             "print(openblas_threads(), blas_is_one_thread())")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["2", "False"], out
    env["OPENBLAS_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1", "True"], out


def test_a_chain_swapped_over_kept_kv_is_the_chain_swapped_over_a_fresh_forward(
    weights, tmp_path, monkeypatch
):
    """Catches prefix-caching's cost proof planned wrong from the K/V the grader keeps (each
    prompt's logits read off the wrong row, the first prompt's K/V sliced short), and a fixed
    prompt whose forward is run again in a later process (a save paying a 991-token forward)."""
    from theinference.curriculum.checks.prefix_caching import swap_after_first

    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path))
    (stage,) = select(load_stages(), ["prefix-caching"])
    (case,) = [c for c in stage.cases if c.check == "prefix_caching_cost"]
    small = {"prompt": {"random": 40, "seed": 51}, "start": 30, "step": 3, "count": 4}
    stage = replace(stage, cases=(replace(case, inputs=small),))
    args = CHECKS[case.check].arguments(stage.cases[0], weights.config)
    answers = Answers.cached(weights)
    answers.bases = kept_prompts(stage, weights.config)
    assert answers.bases == [args[0][-1]]  # the longest prompt is kept
    kept = swap_after_first(answers.recompute, args, 7, answers.prompt_state)
    fresh = swap_after_first(answers.recompute, args, 7, prompt_state)
    expect = CHECKS[case.check].expect(answers.recompute, args)  # [4, vocab], one forward
    np.testing.assert_allclose(kept.plain(), expect, atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(fresh.plain(), expect, atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(kept.expected, fresh.expected, atol=1e-3, rtol=1e-3)
    assert kept.finds[0].k.shape[1] == 30

    later = Answers.cached(weights)  # another process's: the K/V come from the disk
    later.bases = answers.bases
    monkeypatch.setattr(later.recompute, "forward", lambda ids: pytest.fail("a forward again"))
    again = swap_after_first(later.recompute, args, 7, later.prompt_state)
    np.testing.assert_allclose(again.expected, kept.expected, atol=1e-6)


def test_the_search_keeps_no_copy_of_the_plans_kv():
    """Catches the search stacking its own copies of the prompt's K/V and of the swapped K/V
    (a 1023-token prompt's are 151 MB each in float64, every page of them first touched at
    each save), and rows of the swapped K/V read from the wrong layer, head or position once
    they are read in place."""
    from theinference.curriculum.checks.swap_search import Search, rows_of

    finds = [LayerKV(rows(2 * i), rows(2 * i + 1)) for i in range(3)]
    writes = [finds[0], LayerKV(rows(7), finds[1].v), finds[2]]
    search = Search(finds, writes)
    parts = [a for layer in finds + writes for a in (layer.k, layer.v)]
    assert all(any(p is a for a in parts) for p in search.finds + search.writes), "copied"
    assert search.moved.sum() == H * N, "only layer 1's K moves"
    stacked = np.stack([a for layer in writes for a in (layer.k, layer.v)]).reshape(-1, HD)
    numbers = np.random.default_rng(0).permutation(len(stacked))[:17]
    np.testing.assert_array_equal(rows_of(search.writes, numbers), stacked[numbers])
    assert search.index.units.dtype == np.float32


def test_a_large_reply_is_read_into_one_buffer_of_its_size():
    """Catches a reply of many MB (the arrays a swap's moment sends) gathered in a growing
    buffer and copied out again: two first touches of each of its pages, each tens of
    microseconds on a machine whose idle memory goes back to its host; and a frame cut
    anywhere by the pipe (its length included), or a small one right behind a large one, not
    read back whole."""
    import io
    import threading

    from theinference.student.channel import OWN_BUFFER, Incoming
    from theinference.student.worker import worker

    big = np.arange(OWN_BUFFER, dtype=np.float32)  # 4 MiB
    out = io.BytesIO()
    for value in (big, 7):
        worker.write_message(out, *worker.encode_reply({"outcome": "returned", "value": value}))
    data = out.getvalue()
    read_end, write_end = os.pipe()
    cuts = [0, 5, 1001, 3_000_000, len(data) - 3, len(data)]

    def write() -> None:
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            os.write(write_end, data[a:b])
            time.sleep(0.01)
        os.close(write_end)

    threading.Thread(target=write, daemon=True).start()
    incoming, outcomes, most_pending = Incoming(), [], 0
    while incoming.read(read_end):
        most_pending = max(most_pending, len(incoming.pending))
        while (frame := incoming.next_frame()) is not None:
            outcomes.append(frame)
    os.close(read_end)
    assert [o.kind for o in outcomes] == ["returned", "returned"], outcomes
    np.testing.assert_array_equal(outcomes[0].value, big)
    assert outcomes[1].value == 7
    assert most_pending <= 1 << 20, f"{most_pending} bytes of a frame gathered before its buffer"


def test_an_answer_read_from_disk_is_not_copied_on_its_way(tmp_path):
    """Catches a kept answer (a long prompt's K/V: 150 MB) copied between the disk and its
    arrays (the signature's part cut off, joined to the key to be signed, handed to the
    archive reader: four first touches of every page at each save, where one read and one set
    of arrays are two); and a byte changed after the signature still read as the answer."""
    import tracemalloc

    from theinference.grading.answer_cache import MAC_BYTES, AnswerCache

    kv = [LayerKV(k=np.ones((12, 1024, 64)), v=np.full((12, 1024, 64), 2.0))]  # 12 MB
    AnswerCache("ab" * 32, tmp_path).get_or_compute("kv", [[1]], lambda: kv)
    (file,) = (tmp_path / "answers").rglob("*.answer")
    size = file.stat().st_size
    tracemalloc.start()
    back = AnswerCache("ab" * 32, tmp_path).get_or_compute("kv", [[1]], lambda: None)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert back[0].v[0, 0, 0] == 2.0
    assert peak < 2.5 * size, f"{peak / size:.1f}x the answer's size held at once"
    blob = bytearray(file.read_bytes())
    blob[MAC_BYTES + size // 2] ^= 1
    file.write_bytes(bytes(blob))
    again = AnswerCache("ab" * 32, tmp_path).get_or_compute("kv", [[1]], lambda: np.zeros(1))
    assert isinstance(again, np.ndarray) and again.shape == (1,), "a changed answer was read"
