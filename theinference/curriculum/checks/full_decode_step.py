"""full-decode-step: one token decoded after prefill, and proof that it reads the cache."""

from theinference.curriculum.checks.common import Rejected, Verdict, Words, check
from theinference.curriculum.checks.values import checked_array, vector_verdict
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.compare import compare

say = Words(__name__)


def decode_arguments(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["prompt"], config), int(case.inputs["next_id"])]


def decoded(recompute, args):
    return recompute.last_logits(args[0] + [args[1]])


@check(
    "decode_step",
    adapter="run_decode_step",
    arguments=decode_arguments,
    expect=decoded,
    simulate=lambda path, args, variant: path.decode(args[0], [args[1]], variant)[0],
)
def decode_step(value, args, ask, tol, config) -> Verdict:
    """The logits of next_id decoded at position len(prompt_ids), after prefilling the prompt,
    equal a full recompute of prompt_ids + [next_id]."""
    return vector_verdict(
        value, (config.vocab_size,), lambda: ask(args), tol, config, "logits", say("mismatch")
    )


@check(
    "decode_cache_use",
    adapter="run_decode_step",
    arguments=decode_arguments,
    expect=decoded,
    probe=lambda args: {"kind": "zero_cache_after_prefill"},
)
def decode_cache_use(value, args, ask, tol, config) -> Verdict:
    """The decode reads the cache prefill filled: with every K/V row prefill left in the
    cache zeroed, the answer must change."""
    logits, probe = value
    if not probe or not probe.get("applied"):
        why = (probe or {}).get("reason", "the probe did not run")
        return Verdict(Status.FAILED, message=say("cannot_probe", why=why))
    try:
        actual = checked_array(logits, (config.vocab_size,), config, "logits")
    except Rejected as exc:  # a decode from a zeroed cache may fairly produce anything finite
        return Verdict(Status.PASSED, message=f"the answer moved with the cache ({exc})")
    c = compare("logits with the cache zeroed", actual, ask(args), tol, logits=True)
    if c.passed:
        return Verdict(
            Status.FAILED,
            message=f"{say('recomputes')} ({probe.get('zeroed', 0)} K/V values zeroed)",
            hint=say("reads_cache"),
            comparisons=[c],
            suspected_bug="decode-recomputes",
        )
    return Verdict(Status.PASSED, message="the answer depends on the cache, as it should")
