"""generate-loop: the greedy tokens equal the recompute's, and come from the cache."""

import numpy as np

from theinference.curriculum.checks.common import Rejected, Verdict, Words, check
from theinference.curriculum.checks.floor import (
    DECODED_ROW,
    floor_verdict,
    forward_flop,
    with_cost,
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
    expected, near_ties = [], []
    for i, row in enumerate(logits):
        best = int(row.argmax())
        expected.append(best)
        allowed = tol.atol + tol.rtol * abs(float(row[best]))
        near_ties.append(yours[i] != best and float(row[best] - row[yours[i]]) <= allowed)
    first = next((i for i in range(count) if yours[i] != expected[i] and not near_ties[i]), None)
    strip = {
        "yours": yours,
        "expected": expected,
        "first_divergence": first,
        "near_ties": [i for i, tie in enumerate(near_ties) if tie],
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


@check(
    "generate",
    sized_by=("prompt", "max_new_tokens"),
    adapter="run_generate",
    arguments=generate_arguments,
    expect=expect_path,
    flop=generate_flop,
    cached_flop=generate_cached_flop,
    asks_own_arguments=False,  # it asks along the student's own tokens
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
)
def generate_cost(value, args, ask, tol, config) -> Verdict:
    """Generation reads its cache: generating after a long prompt costs a small part of the
    CPU time a recompute's arithmetic needs on this machine (measured in a fresh process)."""
    return with_floor(value, args, ask, tol, config)


def with_floor(value, args, ask, tol, config) -> Verdict:
    """The tokens' verdict, and where the call was measured, its cost's first."""
    tokens, measured = value
    if measured is None:
        return greedy_tokens(tokens, args, ask, tol, config)
    prompt, count = args
    figures = {"steps": count, "prompt": len(prompt)}
    verdict = floor_verdict(measured, say, figures)
    return with_cost(verdict, lambda: greedy_tokens(tokens, args, ask, tol, config))


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
