"""single-step-attention: one token at a time through layer 0's attention, against the cache."""

from theinference.curriculum.checks.common import Verdict, Words, check
from theinference.curriculum.checks.values import vector_verdict
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle.config import ModelConfig

say = Words(__name__)


def seq_arguments(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["seq"], config)]


@check(
    "step_attention",
    adapter="run_step_attention",
    arguments=seq_arguments,
    expect=lambda recompute, args: recompute.layer0_attention_last(args[0]),
    simulate=lambda path, args, variant: path.step_attention(args[0], variant),
)
def step_attention(value, args, ask, tol, config) -> Verdict:
    """Layer 0's attention-sublayer output at the last position, walked one token at a time
    through a fresh cache, equals the recompute's masked attention over the whole sequence."""
    return vector_verdict(
        value,
        (config.n_embd,),
        lambda: ask(args),
        tol,
        config,
        "attention-sublayer output",
        say("mismatch"),
    )
