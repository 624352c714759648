"""single-step-attention: one token at a time through layer 0's attention, against the cache."""

from theinference.curriculum.checks.common import Verdict, Words, check
from theinference.curriculum.checks.swap import after_attn_step, judged, swap_verdict
from theinference.curriculum.checks.values import Wanted, checked_array, vector_verdict
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle.config import ModelConfig

say = Words(__name__)


def seq_arguments(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["seq"], config)]


@check(
    "step_attention",
    sized_by=("seq",),
    adapter="run_step_attention",
    arguments=seq_arguments,
    expect=lambda recompute, args: recompute.layer0_attention_last(args[0]),
    simulate=lambda path, args, variant: path.step_attention(args[0], variant),
    hook="attn_step",
)
def step_attention(value, args, ask, tol, config) -> Verdict:
    """Layer 0's attention-sublayer output at the last position, walked one token at a time
    through a fresh cache, equals the recompute's masked attention over the whole sequence."""
    wanted = Wanted("attention-sublayer output", (config.n_embd,), say("mismatch"))
    return vector_verdict(value, wanted, lambda: ask(args), tol, config)


@check(
    "step_attention_swap",
    sized_by=("seq",),
    adapter="run_step_attention",
    arguments=seq_arguments,
    expect=lambda recompute, args: recompute.layer0_attention_last(args[0]),
    hook="attn_step",
    swap=lambda recompute, args, seed, state: after_attn_step(recompute, args[0], seed),
)
def step_attention_swap(value, args, ask, tol, config) -> Verdict:
    """attn_step attends over its cache: after one of its calls, the cache's rows are swapped
    for the keys of one other sequence and the values of another, and the last position's
    output must be attention over that cache (a recompute of the sequence gives the unswapped
    numbers; an adapter that never calls attn_step cannot be probed and does not pass)."""
    returned, seen = value
    shape = (config.n_embd,)
    label = "attention-sublayer output"
    return judged(
        seen,
        lambda: swap_verdict(
            returned, seen, lambda v: checked_array(v, shape, config, label), say, tol, label
        ),
        lambda: step_attention(returned, args, ask, tol, config),
        say,
    )
