"""Checks for the stages that compose the decode step: per-step identity over a generation,
the greedy generate loop, and prefix caching."""

import numpy as np

from theinference import oracle
from theinference.checks.common import (
    Check,
    OracleRuns,
    Rejected,
    Verdict,
    as_float_array,
    checked_array,
    mismatch_message,
)
from theinference.compare import Comparison, Tolerance, compare
from theinference.config import ModelConfig
from theinference.results import Status
from theinference.stages import Case, token_ids

# --- per-step-identity ---------------------------------------------------------------------

DRIFT_HINT = (
    "Step 0 passes but later steps drift: your decode position counter is not tracking the "
    "absolute index prompt_len + step (wpe shifts under every later token), or the cache is "
    "not growing by exactly one row per step."
)
HANDOFF_HINT = (
    "Off from the very first step: check the prefill -> decode handoff. The cache must hold "
    "len(prompt_ids) rows per layer before the first decode, which sits at position "
    "len(prompt_ids), not 0 and not 1."
)


def _sequence_args(case: Case, config: ModelConfig) -> list:
    inputs = case.inputs
    return [token_ids(inputs["prompt"], config), token_ids(inputs["continuation"], config)]


def _expect_sequence(runs: OracleRuns, args: list) -> np.ndarray:
    # [steps, vocab]: recompute of prompt + continuation[:i+1], last row, for every step i;
    # one causal forward over the whole sequence gives every one of those rows at once
    prompt, continuation = args
    f = runs.forward(prompt + continuation)
    rows = list(range(len(prompt), len(prompt) + len(continuation)))
    return oracle.logits_at(f.hidden, runs.w, rows)


def _judge_sequence(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    prompt, continuation = args
    want = (len(continuation), config.vocab_size)
    try:
        actual = checked_array(value, want, config, "logits")
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc))
    expected = ask(args)
    per_step = [
        compare(
            f"logits at step {i} (position {len(prompt) + i})",
            actual[i],
            expected[i],
            tol,
            logits=True,
        )
        for i in range(len(continuation))
    ]
    steps = [c.worst for c in per_step]
    first = next((i for i, c in enumerate(per_step) if not c.passed), None)
    if first is None:
        return Verdict(
            Status.PASSED, comparisons=[max(per_step, key=lambda c: c.worst)], steps=steps
        )
    bad = per_step[first]
    failing = sum(not c.passed for c in per_step)
    message = (
        f"{failing} of {len(per_step)} steps depart; the first is step {first} "
        f"(position {len(prompt) + first}). {mismatch_message(bad)}"
    )
    return Verdict(
        Status.FAILED,
        message=message,
        comparisons=[bad],
        actual=actual,
        steps=steps,
        hint=DRIFT_HINT if first > 0 else HANDOFF_HINT,
    )


# --- generate-loop -------------------------------------------------------------------------

GENERATE_HINT = (
    "Greedy decoding takes the argmax of each step's logits, feeds that token back at the next "
    "absolute position (prompt_len + step), and stops after exactly max_new_tokens tokens."
)


def _generate_args(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["prompt"], config), int(case.inputs["max_new_tokens"])]


def _expect_path(runs: OracleRuns, args: list) -> np.ndarray:
    # [steps, vocab]: the next-token logits at every step of one given path (prompt, tokens),
    # from one causal forward over prompt + tokens[:-1]
    prompt, tokens = args
    f = runs.forward(prompt + tokens[:-1])
    rows = list(range(len(prompt) - 1, len(prompt) + len(tokens) - 1))
    return oracle.logits_at(f.hidden, runs.w, rows)


def as_token_ids(value, count: int, vocab: int) -> list[int]:
    what = f"a list of {count} token ids"
    array = as_float_array(value, what) if not _is_int_array(value) else value
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


def _is_int_array(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "iu"


def _judge_generate(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    prompt, count = args
    try:
        yours = as_token_ids(value, count, config.vocab_size)
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc), hint=GENERATE_HINT)
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
    row = logits[first]
    gap = float(row[expected[first]] - row[yours[first]])
    return Verdict(
        Status.FAILED,
        tokens=strip,
        hint=GENERATE_HINT,
        message=(
            f"token {first} (position {len(prompt) + first}) departs: yours {yours[first]}, "
            f"the recompute's argmax {expected[first]}, whose logit is higher by {gap:.3g}"
        ),
    )


# --- prefix-caching ------------------------------------------------------------------------

PREFIX_HINTS = {
    "all": "Reuse at most len(prompt) - 1 positions: the last prompt token must be computed to "
    "get its logits, even for an exact repeat.",
    "more": "You reused more positions than the longest common prefix with an earlier prompt: "
    "an off-by-one in the match?",
    "less": "You reused fewer positions than the longest common prefix with an earlier prompt "
    "(any earlier prompt counts, not only the last one): an off-by-one in the match?",
    "logits": "Logits are wrong although the reuse count is right: are the suffix's positions "
    "offset by the reused length (wpe[reused + i])? Is a shared cache mutated in "
    "place, so a later prompt reads another prompt's K/V? Copy the reused rows.",
}


def _prefix_args(case: Case, config: ModelConfig) -> list:
    return [[token_ids(p, config) for p in case.inputs["prompts"]]]


def _expect_prefix(runs: OracleRuns, args: list) -> np.ndarray:
    # [n_prompts, vocab]: each prompt's last-position logits, recomputed on its own
    return np.stack([runs.last_logits(p) for p in args[0]])


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


def _judge_prefix(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    prompts = args[0]
    try:
        pairs = as_logit_reuse_pairs(value, len(prompts), config)
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc), hint=PREFIX_HINTS["all"])
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
                hint=PREFIX_HINTS[kind],
                message=f"prompt {i} ({len(prompts[i])} tokens): reused {reused} "
                f"positions, expected {right}",
            )
        if not c.passed:
            return Verdict(
                Status.FAILED,
                comparisons=[c],
                hint=PREFIX_HINTS["logits"],
                message=f"prompt {i} (reused {reused} of {len(prompts[i])}): {mismatch_message(c)}",
            )
    return Verdict(Status.PASSED, comparisons=[max(comparisons, key=lambda c: c.worst)])


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


CHECKS: dict[str, Check] = {
    "decode_sequence": Check(
        adapter="run_decode_sequence",
        arguments=_sequence_args,
        expect=_expect_sequence,
        judge=_judge_sequence,
    ),
    "generate": Check(
        adapter="run_generate",
        arguments=_generate_args,
        expect=_expect_path,
        judge=_judge_generate,
    ),
    "prefix_caching": Check(
        adapter="run_prefix_caching",
        arguments=_prefix_args,
        expect=_expect_prefix,
        judge=_judge_prefix,
    ),
}
