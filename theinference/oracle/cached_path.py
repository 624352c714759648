"""The cached path, made of the oracle's own steps: a case run the way a student's code runs it.

A prefill is one `forward` over the prompt (it writes the cache, reads none); each later token
goes through `extend`, one token at a time at the position the student's loop gives it, over
the cache so far; single-step attention is layer 0 over a cache of the earlier rows. A
one-token sequence is always a cache of no rows, then that token.

Each check says how its case runs along this path (its `simulate` in checks/); two readers
use it. The noise floor: GPT-2 itself along this path, against the recompute, is the float32
drift a correct solution shows (grading/answers.py). The fingerprints: a `Variant` with a
classic mistake along this path is what a student with that mistake returns
(diagnosis/fingerprints.py).
"""

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import HEAD_DIM
from theinference.oracle.gpt2 import F32, GPT2, Forward, LayerKV, Variant


class Unsimulable(Exception):
    """The variant cannot run this case (e.g. a position past the context)."""


Simulate = Callable[["CachedPath", list, Variant], np.ndarray]  # a check's own case


class CachedPath:
    """Cases along the cached path over one weights file, sharing a prompt's prefill between
    the variants that prefill alike (most of them change a decode step only). `steps` caps a
    multi-step decode (the first steps tell the bugs apart, cheaply); None runs every step."""

    def __init__(self, w: dict, n_layer: int, steps: int | None = None):
        self.w, self.n_layer, self.steps = w, n_layer, steps
        self._prefills: dict = {}

    def answer(self, simulate: Simulate, args: list, variant: Variant = GPT2):
        """What `simulate` gives for a case: finite numbers, or None. Where a query sees no
        key, NumPy gives NaN (an answer the checks refuse before any diagnosis) and a loop over
        no keys, as in JavaScript, a zero sum: the finite one is the bug's."""
        try:
            with np.errstate(all="ignore"):  # a fully masked row is NaN in NumPy
                out = simulate(self, args, variant)
                if not np.all(np.isfinite(out)) and not variant.unseen_zero:
                    out = simulate(self, args, replace(variant, unseen_zero=True))
        except Unsimulable:
            return None
        return out if bool(np.all(np.isfinite(out))) else None

    def step_attention(self, ids: list[int], variant: Variant = GPT2) -> np.ndarray:
        # [d]: layer 0's attention sublayer for the last token, over a cache of the others
        x = oracle.embed(ids, self.w)  # [n, d]
        past = empty_cache(self.w)
        if len(ids) > 1:
            _, past = oracle.attn_sublayer(x[:-1], self.w, 0, variant=variant)
        out, _ = oracle.attn_sublayer(x[-1:], self.w, 0, past, variant=variant)
        return out[0]

    def prefill_logits(self, ids: list[int], variant: Variant = GPT2) -> np.ndarray:
        # [vocab]: the prompt's last position after a prefill
        return oracle.logits_at(self.prefill(ids, variant).hidden, self.w, [-1], variant)[0]

    def prefill(self, ids: list[int], variant: Variant = GPT2) -> Forward:
        key = (tuple(ids), prompt_steps(variant))
        if key not in self._prefills:
            self.check_positions(len(ids), variant)
            self._prefills[key] = oracle.forward(ids, self.w, self.n_layer, False, variant)
        return self._prefills[key]

    def check_positions(self, n: int, variant: Variant) -> None:
        """A prompt whose positions (the variant's) run past wpe cannot be simulated."""
        rows = np.arange(self.w["wpe.weight"].shape[0])  # [n_ctx]
        try:
            inside = len(rows[variant.prompt_positions(n)]) == n
        except IndexError:
            inside = False
        if not inside:
            raise Unsimulable(f"a prompt of {n} positions")

    def decode(self, prompt: list[int], tokens: list[int], variant: Variant = GPT2):
        # [steps, vocab]: the prefill, then one cached step per token (the first `steps`)
        kv, rows = self.prefill(prompt, variant).kv, []
        context = self.w["wpe.weight"].shape[0]
        for step, token in enumerate(tokens[: self.steps]):
            position = variant.step_position(len(prompt), step)
            if not 0 <= position < context:
                raise Unsimulable(f"position {position}")
            f = oracle.extend([token], self.w, self.n_layer, kv, start=position, variant=variant)
            kv = f.kv
            rows.append(oracle.logits_at(f.hidden, self.w, [0], variant)[0])
        return np.stack(rows)


def empty_cache(w: dict) -> LayerKV:
    # [n_head, 0, head_dim]: what a one-token sequence attends over before its own row
    empty = np.zeros((w["wpe.weight"].shape[1] // HEAD_DIM, 0, HEAD_DIM), dtype=F32)
    return LayerKV(empty, empty)


def prompt_steps(variant: Variant) -> Variant:
    """The variant with its decode-only steps put back: two variants that agree on this
    prefill alike."""
    return Variant(
        prompt_positions=variant.prompt_positions,
        prompt_mask=variant.prompt_mask,
        prompt_cache=variant.prompt_cache,
        scale=variant.scale,
        split_heads=variant.split_heads,
        merge_heads=variant.merge_heads,
        swap_kv=variant.swap_kv,
        gelu=variant.gelu,
        unseen_zero=variant.unseen_zero,
    )
