"""generate-loop: the greedy tokens equal the recompute's, and come from the cache."""

from collections.abc import Callable

import numpy as np

from theinference.curriculum.checks.common import Rejected, Verdict, Words, check
from theinference.curriculum.checks.floor import (
    DECODED_ROW,
    cost_beside,
    cut_short,
    floor_verdict,
    forward_flop,
    with_cost,
)
from theinference.curriculum.checks.swap import (
    APART,
    ASK_AGAIN,
    FOLLOWED,
    PATIENCE,
    REDRAWS,
    Seen,
    SwapPlan,
    prompt_kv_and_logits,
    shuffled_cache,
)
from theinference.curriculum.checks.values import as_float_array
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.compare import Tolerance
from theinference.results.error_map import error_map, numbered

say = Words(__name__)


def generate_arguments(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["prompt"], config), int(case.inputs["max_new_tokens"])]


def expect_path(recompute, args: list) -> np.ndarray:
    # [steps, vocab]: the next-token logits at every step of one given path (prompt, tokens),
    # from one causal forward over prompt + tokens[:-1]
    prompt, tokens = args
    f = recompute.forward(prompt + tokens[:-1])
    rows = list(range(len(prompt) - 1, len(prompt) + len(tokens) - 1))
    return oracle.logits_at(f.hidden, recompute.w, rows)


def greedy_tokens(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    """The tokens against the recompute's argmax along the student's own path."""
    prompt, count = args
    try:
        yours = as_token_ids(value, count, config.vocab_size)
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc), hint=say("mismatch"))
    logits = ask([prompt, yours])  # [count, vocab], along your own path
    expected = [int(row.argmax()) for row in logits]
    near_ties = [i for i in range(count) if yours[i] != expected[i]
                 and near_tie(logits[i], yours[i], tol.atol, tol.rtol)]
    first = departure(logits, yours, tol.atol, tol.rtol)
    strip = {
        "yours": yours,
        "expected": expected,
        "first_divergence": first,
        "near_ties": near_ties,
    }
    if first is None:
        return Verdict(Status.PASSED, tokens=strip)
    gap = float(logits[first][expected[first]] - logits[first][yours[first]])
    return Verdict(
        Status.FAILED,
        tokens=strip,
        hint=say("mismatch"),
        where={"token": first, "position": len(prompt) + first},
        error_map=gap_map(logits, yours, tol),
        message=f"token {first} (position {len(prompt) + first}) departs: yours {yours[first]}, "
        f"the recompute's argmax {expected[first]}, whose logit is higher by {gap:.3g}",
    )


def near_tie(row: np.ndarray, token: int, atol: float, rtol: float) -> bool:
    """Whether `token`'s logit lies within tolerance of the row's highest ([vocab])."""
    best = float(row.max())
    return best - float(row[token]) <= atol + rtol * abs(best)


def departure(logits: np.ndarray, tokens: list[int], atol: float, rtol: float) -> int | None:
    """The first step whose token is neither the argmax of its logits ([steps, vocab]) nor
    within tolerance of it; None when every token is greedy's, near-ties allowed."""
    return next((i for i, t in enumerate(tokens) if not near_tie(logits[i], t, atol, rtol)), None)


def gap_map(logits: np.ndarray, yours: list[int], tol: Tolerance) -> dict | None:
    """Token by token across: how far the recompute's argmax logit is above that of your
    token, in tolerances (at most 1: the same token, or a near-tie accepted)."""
    best = logits.max(axis=1).astype(np.float64)  # [count]
    mine = logits[np.arange(len(yours)), yours].astype(np.float64)  # [count]
    ratio = (best - mine) / (tol.atol + tol.rtol * np.abs(best))  # [count]
    gap = ("gap", ["argmax − yours"])
    return error_map(ratio[np.newaxis, :], gap, ("token", numbered(len(yours))))


def generate_flop(args: list, config: ModelConfig) -> float:
    """A recompute runs one forward per new token, over the prompt and the tokens so far."""
    prompt, count = args
    return sum(forward_flop(config, len(prompt) + step) for step in range(count))


def generate_cached_flop(args: list, config: ModelConfig) -> float:
    """A cache runs one forward over the prompt, then one row decoded alone per new token
    (counted at DECODED_ROW prefill rows each)."""
    prompt, count = args
    return forward_flop(config, len(prompt)) + count * DECODED_ROW * forward_flop(config, 1)


def swap_after_prompt(recompute, args: list, seed: int, state) -> SwapPlan | None:
    """The cache swapped right after the prompt's prefill (swap.shuffled_cache), for a
    generation of two tokens or more (the first is the prefill's own: over_swapped); the answer:
    the greedy tokens over the swapped cache, along the student's own (`along`). A draw is
    taken only if it moves greedy's path, so that the recompute's tokens fail over it; None
    when no draw does (the floor is then the only evidence)."""
    prompt, count = args
    if count < 2:
        return None
    finds, first = prompt_kv_and_logits(recompute, prompt, state)
    w, layers, n = recompute.w, recompute.config.n_layer, len(prompt)

    def over(kv: list) -> Callable[[list[int]], np.ndarray]:
        def along(tokens: list[int]) -> np.ndarray:  # [len(tokens), vocab]
            decoded = oracle.extend(tokens[:-1], w, layers, kv, start=n)
            rest = oracle.logits_at(decoded.hidden, w, list(range(len(tokens) - 1)))
            return np.concatenate([first[None], rest])

        return along

    for attempt in range(REDRAWS):
        writes = shuffled_cache(finds, seed + attempt)
        if moves_greedy(recompute, first, finds, writes, count):
            return SwapPlan("prefill", 1, finds, writes, None, lambda: None, along=over(writes),
                            patience=PATIENCE)
    return None


def first_chosen(ask, tol: Tolerance, moved: list):
    """`ask` ([prompt, tokens] -> [count, vocab]) with the first row's top the first token,
    where it is not a near-tie there (then added to `moved`): the first token unjudged."""

    def asked(question) -> np.ndarray:
        logits, chosen = ask(question), question[1][0]
        if near_tie(logits[0], chosen, tol.atol, tol.rtol):
            return logits
        moved.append(chosen)
        top = logits[0].copy()
        top[chosen] = np.nextafter(top.max(), np.inf, dtype=top.dtype)
        return np.concatenate([top[None], logits[1:]])

    return asked


MOVED_WITHIN = 8  # steps a draw is given to move greedy's path, before the next is drawn


def moves_greedy(recompute, first: np.ndarray, finds: list, writes: list, count: int) -> bool:
    """Whether greedy's tokens over the original cache (a recompute's) depart, within `count`
    steps, from greedy's over the swapped one by more than a near-tie (swap.APART's, wider
    than the stage's): step by step along the original's path, stopping at the first that
    does, or MOVED_WITHIN steps (a swap that moves greedy at all moves it within a few: on
    GPT-2's shapes, at the first to fifth step)."""
    w, layers = recompute.w, recompute.config.n_layer
    token, plain_kv, swapped_kv = int(first.argmax()), finds, writes
    for _ in range(1, min(count, MOVED_WITHIN)):
        plain = oracle.extend([token], w, layers, plain_kv)
        swapped = oracle.extend([token], w, layers, swapped_kv)
        plain_kv, swapped_kv = plain.kv, swapped.kv
        token = int(oracle.logits_at(plain.hidden, w, [0])[0].argmax())
        over_swap = oracle.logits_at(swapped.hidden, w, [0])[0]
        if not near_tie(over_swap, token, APART["atol"], APART["rtol"]):
            return True
    return False


@check(
    "generate",
    sized_by=("prompt", "max_new_tokens"),
    adapter="run_generate",
    arguments=generate_arguments,
    expect=expect_path,
    flop=generate_flop,
    cached_flop=generate_cached_flop,
    asks_own_arguments=False,  # it asks along the student's own tokens
    hook="prefill",
    watch="returns",
    swap=swap_after_prompt,
    swap_rows=lambda args: len(args[0]),  # the prompt's
)
def generate(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    """Your greedy tokens equal the recompute's argmax at every step, along your own path;
    where the recompute's top two logits are within tolerance, either token is accepted. A
    long generation (a recompute many times a cache's work) must also cost a small part of a
    recompute's CPU time, measured alone in a fresh process."""
    return with_floor(value, args, ask, tol, config)


@check(
    "generate_cost",
    sized_by=("prompt", "max_new_tokens"),
    adapter="run_generate",
    arguments=generate_arguments,
    expect=expect_path,
    flop=generate_flop,
    asks_own_arguments=False,
    hook="prefill",
    watch="returns",
    swap=swap_after_prompt,
    swap_rows=lambda args: len(args[0]),  # the prompt's
)
def generate_cost(value, args, ask, tol, config) -> Verdict:
    """Generation reads its cache: generating after a long prompt costs a small part of the
    CPU time a recompute's arithmetic needs on this machine (measured in a fresh process)."""
    return with_floor(value, args, ask, tol, config)


def with_floor(value, args, ask, tol, config) -> Verdict:
    """The tokens' verdict over the swapped cache, where the grader swapped it; else, where
    the call was measured, its cost's first, then the tokens'."""
    tokens, measured, seen = value
    if seen is not None and seen.applied and not cut_short(measured):
        verdict = over_swapped(tokens, seen, args, ask, tol, config)
        if verdict.status == Status.PASSED and measured is not None:
            verdict.message = f"{verdict.message} ({cost_beside(measured)})"
        return verdict
    if measured is None:
        return greedy_tokens(tokens, args, ask, tol, config)
    prompt, count = args
    figures = {"steps": count, "prompt": len(prompt)}
    verdict = floor_verdict(measured, say, figures)
    return with_cost(verdict, lambda: greedy_tokens(tokens, args, ask, tol, config))


def over_swapped(tokens, seen: Seen, args, ask, tol, config) -> Verdict:
    """Passed when the tokens are greedy's over the swapped cache (near-ties allowed): only a
    generation that reads its cache makes them, however long it takes. Greedy's over the
    original cache instead: it recomputes. Neither: asked again, measured, where the floor
    judges it (judging.grade_case). The first token is the prefill's own, not judged: the
    swap, made at the first moment every K/V is in memory, may land inside a prefill that reads
    each layer's K/V back from the cache, and move its last layer's reading. Where it is not
    greedy's over the prompt, the swap was drawn to move another path: it proves the cache is
    read only where it moves this one too (departs_apart)."""
    moved: list[int] = []  # the first token, where it is not greedy's over the prompt
    over_swap = first_chosen(lambda question: seen.plan.along(question[1]), tol, moved)
    verdict = greedy_tokens(tokens, args, over_swap, tol, config)
    original = first_chosen(ask, tol, [])  # after the first token, the original's greedy?
    if verdict.status == Status.PASSED:
        path = [args[0], verdict.tokens["yours"]]
        if moved and not departs_apart(over_swap(path), original(path)):
            return Verdict(Status.FAILED, message=ASK_AGAIN, tokens=verdict.tokens)
        verdict.message = FOLLOWED.format(hook=say("hook"))
        return verdict
    if verdict.tokens is None:  # not token ids at all: nothing a swap changes
        return verdict
    if greedy_tokens(tokens, args, original, tol, config).status == Status.PASSED:
        return Verdict(Status.FAILED, message=say("recomputes_swapped"), hint=say("reads_cache"),
                       tokens=verdict.tokens, suspected_bug="decode-recomputes")
    return Verdict(Status.FAILED, message=ASK_AGAIN, tokens=verdict.tokens)


def departs_apart(over_swap: np.ndarray, original: np.ndarray) -> bool:
    """Whether, past the first, some step's original greedy token is no near-tie (APART's,
    wider than the stage's) over the swapped cache ([count, vocab] each, along one path): the
    swap moves that path, as a draw is checked to move the original's (moves_greedy)."""
    return any(not near_tie(over_swap[j], int(original[j].argmax()), APART["atol"], APART["rtol"])
               for j in range(1, len(original)))


def as_token_ids(value, count: int, vocab: int) -> list[int]:
    what = f"a list of {count} token ids"
    array = value if is_int_array(value) else as_float_array(value, what)
    if array.ndim != 1:
        raise Rejected(f"expected {what}, got shape {list(array.shape)}")
    whole = np.all(np.isfinite(array)) and np.all(array == np.round(array))
    if array.dtype.kind == "f" and not whole:
        raise Rejected(f"expected {what}, got non-integer values: logits instead of ids?")
    if len(array) != count:
        raise Rejected(
            f"expected exactly {count} new tokens (max_new_tokens), got {len(array)}"
            + (": is the prompt included?" if len(array) > count else "")
        )
    ids = [int(x) for x in array]
    if any(not 0 <= t < vocab for t in ids):
        raise Rejected(f"token ids must lie in 0..{vocab - 1}")
    return ids


def is_int_array(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "iu"
