"""full-decode-step: one token decoded after prefill, and proof that it reads the cache."""

from dataclasses import replace
from functools import cache

from theinference.curriculum.checks.common import Verdict, Words, check
from theinference.curriculum.checks.swap import after_prefill, judged, swap_verdict
from theinference.curriculum.checks.values import Wanted, checked_array, vector_verdict
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.error_map import error_map, in_tolerances, numbered

say = Words(__name__)


def decode_arguments(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["prompt"], config), int(case.inputs["next_id"])]


def decoded(recompute, args):
    return recompute.last_logits(args[0] + [args[1]])


def swap_after_prefill(recompute, args, seed, state):
    return after_prefill(recompute, args[0], [args[1]], seed, state)


@check(
    "decode_step",
    sized_by=("prompt",),
    adapter="run_decode_step",
    arguments=decode_arguments,
    expect=decoded,
    simulate=lambda path, args, variant: path.decode(args[0], [args[1]], variant)[0],
    hook="prefill",
    watch="returns",
    swap=swap_after_prefill,
    swap_rows=lambda args: len(args[0]),  # the prompt's
)
def decode_step(value, args, ask, tol, config) -> Verdict:
    """The logits of next_id decoded at position len(prompt_ids), after prefilling the prompt,
    equal a full recompute of prompt_ids + [next_id]; and they are read from the cache: right
    after the prompt's prefill, the grader swaps the K/V in the cache for the prompt's own
    shuffled across layers and positions, and the logits must be the decode's over that."""
    return judged_decode(value, args, ask, tol, config)


@check(
    "decode_cache_use",
    sized_by=("prompt",),
    adapter="run_decode_step",
    arguments=decode_arguments,
    expect=decoded,
    hook="prefill",
    watch="returns",
    swap=swap_after_prefill,
    swap_rows=lambda args: len(args[0]),  # the prompt's
)
def decode_cache_use(value, args, ask, tol, config) -> Verdict:
    """The decode reads the cache prefill filled, on arguments drawn for this run: with the
    K/V in it swapped right after the prompt's prefill, for K/V no token sequence has, the
    logits must be the decode's over that cache."""
    return judged_decode(value, args, ask, tol, config)


def judged_decode(value, args, ask, tol, config) -> Verdict:
    returned, seen = value
    shape = (config.vocab_size,)
    expected = cache(lambda: ask(args))  # asked once, for the comparison and the map
    return judged(
        seen,
        lambda: swap_verdict(
            returned, seen, lambda v: checked_array(v, shape, config, "logits"), say, tol, "logits"
        ),
        lambda: mapped(
            vector_verdict(returned, Wanted("logits", shape, say("mismatch")), expected, tol,
                           config),
            expected, len(args[0]), tol,
        ),
        say,
    )


def mapped(verdict: Verdict, expected, position: int, tol) -> Verdict:
    """A decode's failing logits with their map: the new token's row at its position, the
    vocabulary across in runs of token ids (a wrong position or cache departs everywhere; a
    wrong row of wte or one token's logit, in one run)."""
    if verdict.status != Status.FAILED or verdict.actual is None:
        return verdict
    actual = verdict.actual  # [vocab]
    ratio = in_tolerances(actual, expected().reshape(actual.shape), tol)[None, :]  # [1, vocab]
    grid = error_map(ratio, ("position", [str(position)]), ("token id", numbered(ratio.shape[1])))
    return replace(verdict, error_map=grid, where=verdict.where or {"position": position})
