"""per-step-identity: every step of a teacher-forced decode equals the recompute, and every
step reads the cache."""

import numpy as np

from theinference.curriculum.checks import full_decode_step
from theinference.curriculum.checks.common import Rejected, Verdict, Words, check
from theinference.curriculum.checks.swap import after_prefill, judged, swap_verdict
from theinference.curriculum.checks.values import checked_array, mismatch_message
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.compare import Tolerance, compare
from theinference.results.error_map import error_map, in_tolerances, numbered

say = Words(__name__)


def sequence_arguments(case: Case, config: ModelConfig) -> list:
    inputs = case.inputs
    return [token_ids(inputs["prompt"], config), token_ids(inputs["continuation"], config)]


def expect_sequence(recompute, args: list) -> np.ndarray:
    # [steps, vocab]: recompute of prompt + continuation[:i+1], last row, for every step i;
    # one causal forward over the whole sequence gives every one of those rows at once
    prompt, continuation = args
    f = recompute.forward(prompt + continuation)
    rows = list(range(len(prompt), len(prompt) + len(continuation)))
    return oracle.logits_at(f.hidden, recompute.w, rows)


@check(
    "decode_sequence",
    sized_by=("prompt", "continuation"),
    adapter="run_decode_sequence",
    arguments=sequence_arguments,
    expect=expect_sequence,
    simulate=lambda path, args, variant: path.decode(args[0], args[1], variant),
    hook="prefill",
    watch="returns",
    swap=lambda recompute, args, seed, state: after_prefill(
        recompute, args[0], args[1], seed, state
    ),
    swap_rows=lambda args: len(args[0]),  # the prompt's
)
def decode_sequence(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    """Each step's logits, decoding the continuation one token at a time after the prompt,
    equal a full recompute of prompt + continuation[:i+1], at the same tolerance every step;
    and every step reads the cache: right after the prompt's prefill, the grader swaps the
    K/V in the cache for the prompt's own shuffled across layers and positions, and every
    step's logits must be the decode's over that."""
    returned, seen = value
    return judged(
        seen,
        lambda: sequence_swap_verdict(returned, seen, args, tol, config),
        lambda: plain_sequence_verdict(returned, args, ask, tol, config),
        say,
    )


def plain_sequence_verdict(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
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
    failing = sum(not c.passed for c in per_step)
    return Verdict(
        Status.FAILED,
        message=f"{failing} of {len(per_step)} steps depart; the first is step {first} "
        f"(position {len(prompt) + first}). {mismatch_message(per_step[first])}",
        comparisons=[per_step[first]],
        actual=actual,
        steps=steps,
        hint=say("drift") if first > 0 else full_decode_step.say("mismatch"),
        where={"step": first, "position": len(prompt) + first},
        error_map=steps_map(actual, expected, tol),
    )


def steps_map(actual, expected, tol: Tolerance) -> dict | None:
    """Step by step down, the vocabulary across in runs of token ids."""
    ratio = in_tolerances(actual, expected, tol)  # [steps, vocab]
    steps, vocab = ratio.shape
    return error_map(ratio, ("step", numbered(steps)), ("token id", numbered(vocab)))


@check(
    "decode_sequence_swap",
    sized_by=("prompt", "continuation"),
    adapter="run_decode_sequence",
    arguments=sequence_arguments,
    expect=expect_sequence,
    hook="prefill",
    watch="returns",
    swap=lambda recompute, args, seed, state: after_prefill(
        recompute, args[0], args[1], seed, state
    ),
    swap_rows=lambda args: len(args[0]),  # the prompt's
)
def decode_sequence_swap(value, args, ask, tol, config) -> Verdict:
    """Every step reads the cache, on arguments drawn for this run: with the K/V prefill left
    swapped, right after the prompt's prefill, for K/V no token sequence has, every step's
    logits must be the decode's over that cache (a recompute, or one causal forward over
    prompt + continuation, gives the unswapped numbers)."""
    returned, seen = value
    return judged(
        seen,
        lambda: sequence_swap_verdict(returned, seen, args, tol, config),
        lambda: plain_sequence_verdict(returned, args, ask, tol, config),
        say,
    )


def sequence_swap_verdict(returned, seen, args, tol, config) -> Verdict:
    shape = (len(args[1]), config.vocab_size)
    return swap_verdict(
        returned, seen, lambda v: checked_array(v, shape, config, "logits"), say, tol, "logits"
    )
