"""prefix-caching: each prompt's logits and reuse count, and reuse that really saves work."""

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
    SwapPlan,
    prompt_state,
    shuffled_cache,
)
from theinference.curriculum.checks.values import checked_array, mismatch_message
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.compare import Comparison, Tolerance, compare
from theinference.results.error_map import error_map, in_tolerances, numbered

say = Words(__name__)


def prefix_arguments(case: Case, config: ModelConfig) -> list:
    inputs = case.inputs
    if "prompts" in inputs:
        return [[token_ids(p, config) for p in inputs["prompts"]]]
    # a chain: `count` prompts, the first `start` tokens long, each `step` longer than the last
    ids = token_ids(inputs["prompt"], config)
    lengths = [int(inputs["start"]) + i * int(inputs["step"]) for i in range(int(inputs["count"]))]
    return [[ids[:n] for n in lengths]]


def expect_prefix(recompute, args: list) -> np.ndarray:
    # [n_prompts, vocab]: each prompt's last-position logits, recomputed on its own
    return np.stack([recompute.last_logits(p) for p in args[0]])


def prefix_flop(args: list, config: ModelConfig) -> float:
    """A recompute runs one forward over each prompt."""
    return sum(forward_flop(config, len(p)) for p in args[0])


def prefix_cached_flop(args: list, config: ModelConfig) -> float:
    """Reuse runs a forward over each prompt's rows past what it reuses: a prefill where it
    reuses nothing, else rows decoded after the reused ones (DECODED_ROW prefill rows each)."""
    prompts = args[0]
    reuse = expected_reuse(prompts)
    return sum(
        forward_flop(config, len(p)) if r == 0 else DECODED_ROW * forward_flop(config, len(p) - r)
        for p, r in zip(prompts, reuse, strict=True)
    )


@check(
    "prefix_caching",
    sized_by=("prompts",),
    adapter="run_prefix_caching",
    arguments=prefix_arguments,
    expect=expect_prefix,
    flop=prefix_flop,
    cached_flop=prefix_cached_flop,
)
def prefix_caching(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    """Each prompt's logits equal the recompute's, and `reused` is the longest common prefix
    with any earlier prompt, at most len(prompt) - 1. Prompts whose recompute needs many
    times reuse's work must also cost a small part of it, measured in a fresh process."""
    pairs, measured, _ = value  # (a swap, where made, is judged by prefix_caching_cost)
    if measured is None:
        return logits_and_reuse(pairs, args, ask, tol, config)
    prompts = args[0]
    figures = {"prompts": len(prompts), "total": len(prompts[-1])}
    verdict = floor_verdict(measured, say, figures, bug=None)
    return with_cost(verdict, lambda: logits_and_reuse(pairs, args, ask, tol, config))


def logits_and_reuse(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    """Each prompt's logits and `reused` count against the recompute's."""
    prompts = args[0]
    try:
        pairs = as_logit_reuse_pairs(value, len(prompts), config)
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc), hint=say("all"))
    want = expected_reuse(prompts)
    expected = ask(args)
    comparisons: list[Comparison] = []
    for i, ((logits, reused), right) in enumerate(zip(pairs, want, strict=True)):
        c = compare(f"prompt {i} logits", logits, expected[i], tol, logits=True)
        comparisons.append(c)
        if reused != right:
            kind = "all" if reused >= len(prompts[i]) else ("more" if reused > right else "less")
            return Verdict(
                Status.FAILED,
                comparisons=[c],
                hint=say(kind),
                message=f"prompt {i} ({len(prompts[i])} tokens): reused {reused} "
                f"positions, expected {right}",
                where={"prompt": i},
            )
        if not c.passed:
            return Verdict(
                Status.FAILED,
                comparisons=[c],
                hint=say("reused_nothing") if reused == 0 else say("logits"),
                message=f"prompt {i} (reused {reused} of {len(prompts[i])}): {mismatch_message(c)}",
                where={"prompt": i},
                error_map=prompts_map([p[0] for p in pairs], expected, tol),
            )
    return Verdict(Status.PASSED, comparisons=[max(comparisons, key=lambda c: c.worst)])


def prompts_map(logits: list[np.ndarray], expected: np.ndarray, tol) -> dict | None:
    """Prompt by prompt down, the vocabulary across in runs of token ids."""
    ratio = in_tolerances(np.stack(logits), expected, tol)  # [prompts, vocab]
    prompts, vocab = ratio.shape
    return error_map(ratio, ("prompt", numbered(prompts)), ("token id", numbered(vocab)))


def expect_chain(recompute, args: list) -> np.ndarray:
    # [n_prompts, vocab]: prompts that are each a prefix of the longest, from one causal
    # forward over it (the same numbers as each recomputed alone)
    prompts = args[0]
    longest = max(prompts, key=len)
    if not all(longest[: len(p)] == p for p in prompts):
        return expect_prefix(recompute, args)
    f = recompute.forward(longest)
    return oracle.logits_at(f.hidden, recompute.w, [len(p) - 1 for p in prompts])


def swap_after_first(recompute, args: list, seed: int, state=prompt_state) -> SwapPlan | None:
    """A chain's cache (each prompt the one before and more) swapped right after its first
    prompt is processed, for that prompt's K/V with some layers shuffled (swap.shuffled_cache);
    expected [count, vocab]: the first prompt's own logits (computed before the swap), every
    later one's over the swapped rows and the rows computed on them since: one decode of the
    longest prompt's rest over the swapped K/V. Only a chain: in other prompt sets a reuse may
    read any of several earlier prompts' rows, which the swap would make differ. `state`
    (swap.prompt_state, or the K/V the grader keeps): the longest prompt's K/V and logits."""
    prompts = args[0]
    if len(prompts) < 2 or not is_chain(prompts):
        return None
    w, layers, n, longest = recompute.w, recompute.config.n_layer, len(prompts[0]), prompts[-1]
    # [len(longest) - n + 1, vocab]: every position's logits from the first prompt's last on
    _, each = state(recompute, longest[: n - 1], longest[n - 1 :])
    plain = each[[len(p) - n for p in prompts]]  # [count, vocab]: each prompt's last
    finds, _ = state(recompute, prompts[0], [])  # the same forward's first rows, or kept
    rows = [len(p) - 1 - n for p in prompts[1:]]
    for attempt in range(REDRAWS):
        writes = shuffled_cache(finds, seed + attempt)
        decoded = oracle.extend(longest[n:], w, layers, writes, start=n)
        later = oracle.logits_at(decoded.hidden, w, rows)  # [count - 1, vocab]
        if not np.allclose(later, plain[1:], **APART):  # a recompute's answer fails over it
            expected = np.concatenate([plain[:1], later])
            return SwapPlan("prefill", 1, finds, writes, expected, lambda: plain,
                            patience=PATIENCE)
    return None  # no draw moves the answers: the floor is the only evidence


def is_chain(prompts: list[list[int]]) -> bool:
    """Each prompt the one before and at least one token more."""
    pairs = zip(prompts[:-1], prompts[1:], strict=True)
    return all(len(b) > len(a) and b[: len(a)] == a for a, b in pairs)


@check(
    "prefix_caching_cost",
    sized_by=("prompts", "prompt"),  # drawn as one prompt its growing prompts extend
    adapter="run_prefix_caching",
    arguments=prefix_arguments,
    expect=expect_chain,
    flop=prefix_flop,
    hook="prefill",
    watch="returns",
    swap=swap_after_first,
    swap_rows=lambda args: len(args[0][0]),  # the first prompt's
    kept_prompt=lambda args: args[0][-1],  # the longest, each prompt a beginning of
)
def prefix_caching_cost(value, args, ask, tol, config) -> Verdict:
    """Reuse is real: right after the first of prompts that each extend the one before, the
    grader swaps the K/V in the cache for K/V no token sequence has, and every later prompt's
    logits must be the ones over that cache, however long they take. Where no swap could be
    made, they must cost a small part of the CPU time recomputing each of them needs on this
    machine (measured in a fresh process)."""
    _, measured, seen = value
    if seen is not None and seen.applied and not cut_short(measured):
        return chain_over_swapped(value, args, ask, tol, config)
    return prefix_caching(value, args, ask, tol, config)


def chain_over_swapped(value, args, ask, tol, config) -> Verdict:
    """Passed when every prompt's logits and reuse are the ones over the swapped cache; the
    original's logits instead: every prompt recomputed; neither: asked again, measured,
    where the floor judges (judging.grade_case)."""
    pairs, measured, seen = value
    over_swap = prefill_own(pairs, seen.plan.expected, len(args[0]), config)
    swapped = logits_and_reuse(pairs, args, lambda _: over_swap, tol, config)
    if swapped.status == Status.PASSED:
        followed = FOLLOWED.format(hook=say("hook"))
        swapped.message = f"{followed} ({cost_beside(measured or {})})"
        return swapped
    plain = logits_and_reuse(pairs, args, ask, tol, config)
    if plain.status == Status.PASSED:
        return Verdict(Status.FAILED, message=say("recomputes_swapped"), hint=say("reads_cache"),
                       comparisons=swapped.comparisons, suspected_bug="decode-recomputes")
    if plain.message == swapped.message:  # a reuse count or a value wrong either way
        return plain
    return Verdict(Status.FAILED, message=ASK_AGAIN, comparisons=swapped.comparisons)


def prefill_own(pairs, expected: np.ndarray, count: int, config: ModelConfig) -> np.ndarray:
    """The answers over the swapped cache ([count, vocab]), the first prompt's logits its own:
    they are its prefill's, and the swap, made at the first moment every K/V is in memory, may
    land inside that prefill (one that reads each layer's K/V back from the cache reads its
    last layer's swapped), where it moves nothing a later prompt reads."""
    try:
        own = as_logit_reuse_pairs(pairs, count, config)[0][0]
    except Rejected:
        return expected  # said by the comparison itself
    over_swap = expected.copy()
    over_swap[0] = own
    return over_swap


def expected_reuse(prompts: list[list[int]]) -> list[int]:
    out = []
    for i, p in enumerate(prompts):
        lcp = max((common_prefix(p, q) for q in prompts[:i]), default=0)
        out.append(min(lcp, len(p) - 1))
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def as_logit_reuse_pairs(value, count: int, config: ModelConfig) -> list[tuple[np.ndarray, int]]:
    if not isinstance(value, list) or len(value) != count:
        got = f"{len(value)} items" if isinstance(value, list) else type(value).__name__
        raise Rejected(f"expected one (logits, reused) pair per prompt ({count}), got {got}")
    pairs = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) != 2:
            raise Rejected(f"prompt {i}: expected a (logits, reused) pair")
        logits = checked_array(item[0], (config.vocab_size,), config, f"prompt {i} logits")
        reused = item[1]
        if not (
            isinstance(reused, np.ndarray) and reused.shape == () and reused.dtype.kind in "iu"
        ):
            raise Rejected(f"prompt {i}: 'reused' must be an integer count of positions")
        pairs.append((logits, int(reused)))
    return pairs
