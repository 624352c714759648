"""per-step-identity: every step of a teacher-forced decode equals the recompute, and the
decode costs what a cache costs."""

import numpy as np

from theinference.curriculum.checks import full_decode_step
from theinference.curriculum.checks.common import Rejected, Verdict, Words, check
from theinference.curriculum.checks.cost import baseline_probe, cost_verdict, with_cost
from theinference.curriculum.checks.values import checked_array, mismatch_message
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.compare import Tolerance, compare

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
    adapter="run_decode_sequence",
    arguments=sequence_arguments,
    expect=expect_sequence,
    simulate=lambda path, args, variant: path.decode(args[0], args[1], variant),
)
def decode_sequence(value, args, ask, tol: Tolerance, config: ModelConfig) -> Verdict:
    """Each step's logits, decoding the continuation one token at a time after the prompt,
    equal a full recompute of prompt + continuation[:i+1], at the same tolerance every step."""
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
    )


@check(
    "decode_sequence_cost",
    adapter="run_decode_sequence",
    arguments=sequence_arguments,
    expect=expect_sequence,
    probe=lambda args: baseline_probe("run_prefill", [args[0] + args[1]]),
)
def decode_sequence_cost(value, args, ask, tol, config) -> Verdict:
    """The decode reads its cache: decoding the continuation after a long prompt costs about
    as much CPU as your own prefill of the same tokens, not many times more."""
    logits, probe = value
    prompt, continuation = args
    figures = {
        "steps": len(continuation),
        "prompt": len(prompt),
        "total": len(prompt) + len(continuation),
    }
    measured = cost_verdict(probe, say, figures)
    return with_cost(measured, lambda: decode_sequence(logits, args, ask, tol, config))
