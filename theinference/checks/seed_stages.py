"""Checks for the three seed stages: single-step attention, prefill, one full decode step."""

import numpy as np

from theinference import oracle
from theinference.checks.common import (
    Check,
    OracleRuns,
    Rejected,
    Verdict,
    as_float_array,
    check_finite,
    checked_array,
    mismatch_message,
    vector_verdict,
)
from theinference.compare import compare
from theinference.config import ModelConfig
from theinference.results import Status
from theinference.stages import Case, token_ids

# --- single-step-attention -----------------------------------------------------------------

STEP_ATTENTION_HINT = (
    "A difference beyond tolerance is a real bug, not float drift. The classic three: the new "
    "token must attend over the whole cache after appending (oldLen + 1 rows, itself included); "
    "no causal mask in the single-token step (the new token legitimately sees every cached "
    "position); and positions come from embed (wpe[0..n-1]), so attn_step never touches wpe."
)


def _seq_args(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["seq"], config)]


def _judge_step_attention(value, args, ask, tol, config) -> Verdict:
    return vector_verdict(
        value,
        (config.n_embd,),
        lambda: ask(args),
        tol,
        config,
        "attention-sublayer output",
        STEP_ATTENTION_HINT,
    )


# --- build-prefill -------------------------------------------------------------------------

PREFILL_HINT = (
    "Prefill embeds token i with wpe[i], runs all layers under the full lower-triangular mask, "
    "applies ln_f, and unembeds only the last position. Far outside 1e-3 is a real bug "
    "(wrong positions, a missing mask, a missing ln_f), not rounding."
)


def _prompt_args(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["prompt"], config)]


def _judge_logits(hint: str):
    def judge(value, args, ask, tol, config) -> Verdict:
        return vector_verdict(
            value, (config.vocab_size,), lambda: ask(args), tol, config, "logits", hint
        )

    return judge


def _expect_cache(runs: OracleRuns, args: list) -> list[oracle.LayerKV]:
    return runs.forward(args[0]).kv


def as_layer_pairs(value, n_layer: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Accept a list of (k, v) pairs, or one array [n_layer, 2, n_head, n, head_dim]."""
    what = f"{n_layer} (k, v) pairs, one per layer"
    if isinstance(value, np.ndarray) and value.ndim == 5 and value.shape[1] == 2:
        value = [[layer[0], layer[1]] for layer in value]
    if not isinstance(value, list):
        raise Rejected(f"returned {type(value).__name__}, expected {what}")
    if len(value) != n_layer:
        raise Rejected(
            f"returned {len(value)} layer(s), expected {what}: one cache per layer, never shared"
        )
    pairs = []
    for layer, item in enumerate(value):
        if isinstance(item, np.ndarray) and item.ndim >= 1 and item.shape[0] == 2:
            item = [item[0], item[1]]
        if not isinstance(item, list) or len(item) != 2:
            raise Rejected(f"layer {layer}: expected a (k, v) pair")
        k, v = (as_float_array(x, f"layer {layer} K/V") for x in item)
        pairs.append((k, v))
    return pairs


def _judge_cache(value, args, ask, tol, config) -> Verdict:
    want = (config.n_head, len(args[0]), config.n_embd // config.n_head)
    try:
        pairs = as_layer_pairs(value, config.n_layer)
        for layer, (k, v) in enumerate(pairs):
            for name, got in (("K", k), ("V", v)):
                if got.shape != want:
                    return Verdict(
                        Status.FAILED,
                        hint=CACHE_HINT,
                        message=cache_shape_message(layer, name, got.shape, want),
                        suspected_bug=shape_suspect(got.shape, want, config.n_layer),
                    )
                check_finite(got, f"layer {layer} {name}")
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc), hint=CACHE_HINT)
    return localise(pairs, ask(args), tol)


def localise(pairs, expected: list[oracle.LayerKV], tol) -> Verdict:
    """Walk the cache layer by layer (K, then V) and name where it first departs."""
    fine = []
    for layer, ((k, v), ref) in enumerate(zip(pairs, expected, strict=True)):
        for name, got, want in (("K", k, ref.k), ("V", v, ref.v)):
            c = compare(f"layer {layer} {name}", got, want, tol)
            if not c.passed:
                head, pos = first_departure(got, want, tol)
                before = f"{fine[-1]} and everything before it match; " if fine else ""
                return Verdict(
                    Status.FAILED,
                    hint=CACHE_HINT,
                    comparisons=[c],
                    message=f"{before}layer {layer} {name} departs at position {pos}, head "
                    f"{head}: {mismatch_message(c)}",
                )
            fine.append(f"layer {layer} {name}")
    return Verdict(
        Status.PASSED,
        comparisons=[
            compare(
                "every layer's K and V",
                np.stack([np.stack(p) for p in pairs]),
                np.stack([np.stack([r.k, r.v]) for r in expected]),
                tol,
            )
        ],
    )


def first_departure(got: np.ndarray, want: np.ndarray, tol) -> tuple[int, int]:
    """(head, position) of the earliest position where any value is out of tolerance."""
    bad = np.abs(got.astype(np.float64) - want) > tol.atol + tol.rtol * np.abs(want)  # [h, n, hd]
    heads_at = bad.any(axis=2)  # [h, n]
    pos = int(np.argmax(heads_at.any(axis=0)))
    return int(np.argmax(heads_at[:, pos])), pos


def shape_suspect(got: tuple, want: tuple, n_layer: int) -> str | None:
    if len(got) != 3 or got[0] != want[0] or got[2] != want[2]:
        return None
    if got[1] == want[1] * n_layer and n_layer > 1:
        return "shared-cache"
    if got[1] < want[1]:
        return "prefill-cache-short"
    return "prefill-cache-long" if got[1] > want[1] else None


CACHE_HINT = (
    "When prefill finishes, every layer's cache holds exactly prompt_len rows: K and V each "
    "[n_head, prompt_len, 64]. Embed with wpe[0..prompt_len-1] and write one cache row per "
    "prompt position, no more, no less; the first decode step continues at position prompt_len."
)


def cache_shape_message(layer: int, name: str, got: tuple, want: tuple) -> str:
    msg = f"layer {layer} {name} has shape {list(got)}, expected {list(want)}"
    if len(got) == 3 and got[0] == want[0] and got[2] == want[2] and got[1] != want[1]:
        diff = got[1] - want[1]
        rows = "row" if abs(diff) == 1 else "rows"
        msg += (
            f": the cache holds {got[1]} positions for a {want[1]}-token prompt "
            f"({abs(diff)} {rows} too {'many' if diff > 0 else 'few'})"
        )
    elif len(got) == 3 and got[0] == want[1] and got[1] == want[0]:
        msg += ": heads and positions swapped? The layout is [n_head, length, head_dim]"
    return msg


# --- full-decode-step ----------------------------------------------------------------------

DECODE_HINT = (
    "The new token sits at absolute position len(prompt_ids), not 0 and not 1. If this is far "
    "outside 1e-3 it is a real bug: a wrong position, one cache shared across layers, or a "
    "missing ln_f. Check the prefill -> decode handoff: the cache must already hold "
    "len(prompt_ids) rows per layer before you decode."
)


def _decode_args(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["prompt"], config), int(case.inputs["next_id"])]


RECOMPUTE_MESSAGE = (
    "decode_step gave the right logits although the grader zeroed every K and V row that "
    "prefill left in mc.layers: it recomputes the whole sequence instead of reading the "
    "cache (or keeps K/V somewhere other than mc.layers)"
)
RECOMPUTE_HINT = (
    "The point of the cache: decode_step runs ONE new token through each layer, reading the "
    "prompt's K/V from mc.layers[l] and appending its own. Recomputing the prompt every step "
    "gives the same numbers at quadratic cost."
)


def _judge_cache_use(value, args, ask, tol, config) -> Verdict:
    logits, probe = value
    if not probe or not probe.get("applied"):
        why = (probe or {}).get("reason", "the probe did not run")
        return Verdict(Status.PASSED, message=f"cache-use check not applicable: {why}")
    try:
        actual = checked_array(logits, (config.vocab_size,), config, "logits")
    except Rejected as exc:  # a decode from a zeroed cache may fairly produce anything finite
        return Verdict(Status.PASSED, message=f"the answer moved with the cache ({exc})")
    c = compare("logits with the cache zeroed", actual, ask(args), tol, logits=True)
    if c.passed:
        return Verdict(
            Status.FAILED,
            message=RECOMPUTE_MESSAGE,
            hint=RECOMPUTE_HINT,
            comparisons=[c],
            suspected_bug="decode-recomputes",
        )
    return Verdict(
        Status.PASSED, message="the answer depends on the cache, as it should", comparisons=[]
    )


CHECKS: dict[str, Check] = {
    "step_attention": Check(
        adapter="run_step_attention",
        arguments=_seq_args,
        expect=lambda runs, args: runs.layer0_attention_last(args[0]),
        judge=_judge_step_attention,
        second_path=lambda runs, args: runs.layer0_attention_cached_path(args[0]),
    ),
    "prefill_logits": Check(
        adapter="run_prefill",
        arguments=_prompt_args,
        expect=lambda runs, args: runs.last_logits(args[0]),
        judge=_judge_logits(PREFILL_HINT),
        second_path=lambda runs, args: runs.last_logits_cached_path(args[0]),
    ),
    "prefill_cache": Check(
        adapter="run_prefill_cache",
        arguments=_prompt_args,
        expect=_expect_cache,
        judge=_judge_cache,
    ),
    "decode_cache_use": Check(
        adapter="run_decode_step",
        arguments=_decode_args,
        expect=lambda runs, args: runs.last_logits(args[0] + [args[1]]),
        judge=_judge_cache_use,
        probe="zero_cache_after_prefill",
    ),
    "decode_step": Check(
        adapter="run_decode_step",
        arguments=_decode_args,
        expect=lambda runs, args: runs.last_logits(args[0] + [args[1]]),
        judge=_judge_logits(DECODE_HINT),
        second_path=lambda runs, args: runs.last_logits_cached_path(args[0] + [args[1]]),
    ),
}
