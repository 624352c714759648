"""build-prefill: the prompt's logits and the cache prefill leaves behind."""

import numpy as np

from theinference.curriculum.checks.common import Rejected, Verdict, Words, check
from theinference.curriculum.checks.values import (
    Wanted,
    as_float_array,
    check_finite,
    mismatch_message,
    vector_verdict,
)
from theinference.curriculum.stages import Case, token_ids
from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import ModelConfig
from theinference.results import Status
from theinference.results.compare import compare
from theinference.results.error_map import MAX_ROWS, error_map, in_tolerances, numbered

say = Words(__name__)


def prompt_arguments(case: Case, config: ModelConfig) -> list:
    return [token_ids(case.inputs["prompt"], config)]


@check(
    "prefill_logits",
    sized_by=("prompt",),
    adapter="run_prefill",
    arguments=prompt_arguments,
    expect=lambda recompute, args: recompute.last_logits(args[0]),
    simulate=lambda path, args, variant: path.prefill_logits(args[0], variant),
)
def prefill_logits(value, args, ask, tol, config) -> Verdict:
    """The logits prefill returns for the prompt's last position equal the recompute's."""
    wanted = Wanted("logits", (config.vocab_size,), say("mismatch"))
    return vector_verdict(value, wanted, lambda: ask(args), tol, config)


@check(
    "prefill_cache",
    sized_by=("prompt",),
    adapter="run_prefill_cache",
    arguments=prompt_arguments,
    expect=lambda recompute, args: recompute.forward(args[0]).kv,
)
def prefill_cache(value, args, ask, tol, config) -> Verdict:
    """After prefill, every layer's K and V are [n_head, prompt_len, head_dim] and hold the
    recompute's keys and values, position by position."""
    want = (config.n_head, len(args[0]), config.n_embd // config.n_head)
    try:
        pairs = as_layer_pairs(value, config.n_layer)
        for layer, (k, v) in enumerate(pairs):
            for name, got in (("K", k), ("V", v)):
                if got.shape != want:
                    return Verdict(
                        Status.FAILED,
                        hint=say("cache"),
                        message=cache_shape_message(layer, name, got.shape, want),
                        suspected_bug=shape_suspect(got.shape, want, config.n_layer),
                    )
                check_finite(got, f"layer {layer} {name}")
    except Rejected as exc:
        return Verdict(Status.FAILED, message=str(exc), hint=say("cache"))
    return localise(pairs, ask(args), tol)


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


def localise(pairs, expected: list[oracle.LayerKV], tol) -> Verdict:
    """Walk the cache layer by layer (K, then V) and name where it first departs; a cache
    whose every layer holds one layer's K/V is named for what it is."""
    held = one_layer_everywhere(pairs, expected, tol)
    fine = []
    for layer, ((k, v), ref) in enumerate(zip(pairs, expected, strict=True)):
        for name, got, want in (("K", k, ref.k), ("V", v, ref.v)):
            c = compare(f"layer {layer} {name}", got, want, tol)
            if not c.passed:
                head, pos = first_departure(got, want, tol)
                before = f"{fine[-1]} and everything before it match; " if fine else ""
                shared = say("cache_one_layer", layer=held) + " " if held is not None else ""
                return Verdict(
                    Status.FAILED,
                    hint=departing_hint(layer, name) if held is None else say("cache_shared"),
                    comparisons=[c],
                    message=f"{shared}{before}layer {layer} {name} departs at position {pos}, "
                    f"head {head}: {mismatch_message(c)}",
                    suspected_bug="shared-cache" if held is not None else None,
                    where={"layer": layer, "tensor": name, "position": pos, "head": head},
                    error_map=cache_map(pairs, expected, tol),
                )
            fine.append(f"layer {layer} {name}")
    everything = compare(
        "every layer's K and V",
        np.stack([np.stack(p) for p in pairs]),  # [layers, 2, h, n, hd]
        np.stack([np.stack([r.k, r.v]) for r in expected]),
        tol,
    )
    return Verdict(Status.PASSED, comparisons=[everything])


def one_layer_everywhere(pairs, expected: list[oracle.LayerKV], tol) -> int | None:
    """The layer whose K/V every layer holds (one cache shared by every layer, each layer's
    prefill assigning over the one before: the last layer's, right there alone), or None."""
    if len(pairs) < 2:
        return None
    k0, v0 = pairs[0]
    if not all(np.array_equal(k, k0) and np.array_equal(v, v0) for k, v in pairs[1:]):
        return None
    return next((layer for layer, ref in enumerate(expected)
                 if compare("", k0, ref.k, tol).passed and compare("", v0, ref.v, tol).passed),
                None)


def cache_map(pairs, expected: list[oracle.LayerKV], tol) -> dict | None:
    """Layer by layer (K, then V, where they fit) down, position across: each cell the worst
    of its heads."""
    got = np.stack([np.stack(p) for p in pairs])  # [layers, 2, h, n, hd]
    want = np.stack([np.stack([r.k, r.v]) for r in expected])
    ratio = in_tolerances(got, want, tol).max(axis=(2, 4))  # [layers, 2, n]
    layers, _, n = ratio.shape
    if 2 * layers > MAX_ROWS:  # a row per layer, the worst of its K and V
        return error_map(ratio.max(axis=1), ("layer", numbered(layers)), ("position", numbered(n)))
    rows = [f"{layer} {name}" for layer in range(layers) for name in "KV"]
    return error_map(ratio.reshape(2 * layers, n), ("layer", rows), ("position", numbered(n)))


def departing_hint(layer: int, name: str) -> str:
    """The shapes are right, so the row count is not the problem: what the layer that departs
    first says about the cause."""
    if layer == 0:
        return say("cache_first_layer", name=name)
    return say("cache_later_layer", layer=layer, before=layer - 1)


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
