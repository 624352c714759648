"""The student's cached path, made of the oracle's own steps: what a student whose code has a
`Variant`'s mistake returns for a case (fingerprints.py compares that with their answer).

A prefill is `oracle.forward`, each decode step `oracle.extend` by one token at the position
the student's loop gives it; single-step attention is layer 0 over a cache of the earlier
rows. With the default variant these are the oracle's numbers along its cached path (tested).
"""

from dataclasses import replace

import numpy as np

from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import HEAD_DIM
from theinference.oracle.gpt2 import F32, GPT2, Forward, LayerKV, Variant

SIMULATED = ("step_attention", "prefill_logits", "decode_step", "decode_sequence")
FINGERPRINT_STEPS = 4  # a decode sequence's first steps tell the bugs apart, cheaply


class Unsimulable(Exception):
    """The variant cannot run this case (e.g. a position past the context)."""


class CachedPath:
    """Runs variants over one weights file, sharing a prompt's prefill between the variants
    that prefill alike (most of them change a decode step only)."""

    def __init__(self, w: dict, n_layer: int):
        self.w, self.n_layer = w, n_layer
        self._prefills: dict = {}

    def answer(self, check: str, args: list, variant: Variant = GPT2) -> np.ndarray | None:
        """What the variant returns for a case of `check`: finite numbers, or None. Where a
        query sees no key, NumPy gives NaN (an answer the checks refuse before any diagnosis)
        and a loop over no keys, as in JavaScript, a zero sum: the finite one is the bug's."""
        try:
            with np.errstate(all="ignore"):  # a fully masked row is NaN in NumPy
                out = self._run(check, args, variant)
                if not np.all(np.isfinite(out)) and not variant.unseen_zero:
                    out = self._run(check, args, replace(variant, unseen_zero=True))
        except Unsimulable:
            return None
        return out if bool(np.all(np.isfinite(out))) else None

    def _run(self, check: str, args: list, variant: Variant) -> np.ndarray:
        if check == "step_attention":
            return self.step_attention(args[0], variant)
        if check == "prefill_logits":
            f = self.prefill(args[0], variant)
            return oracle.logits_at(f.hidden, self.w, [-1], variant)[0]
        if check == "decode_step":
            return self.decode(args[0], [args[1]], variant)[0]
        if check == "decode_sequence":
            return self.decode(args[0], args[1][:FINGERPRINT_STEPS], variant)
        raise Unsimulable(check)

    def step_attention(self, ids: list[int], variant: Variant) -> np.ndarray:
        # [d]: layer 0's attention sublayer for the last token, over a cache of the others
        x = oracle.embed(ids, self.w)  # [n, d]
        if len(ids) > 1:
            _, past = oracle.attn_sublayer(x[:-1], self.w, 0, variant=variant)
        else:
            empty = np.zeros((x.shape[1] // HEAD_DIM, 0, HEAD_DIM), dtype=F32)
            past = LayerKV(empty, empty)
        out, _ = oracle.attn_sublayer(x[-1:], self.w, 0, past, variant=variant)
        return out[0]

    def prefill(self, ids: list[int], variant: Variant) -> Forward:
        key = (tuple(ids), prompt_steps(variant))
        if key not in self._prefills:
            self._prefills[key] = oracle.forward(ids, self.w, self.n_layer, True, variant)
        return self._prefills[key]

    def decode(self, prompt: list[int], tokens: list[int], variant: Variant) -> np.ndarray:
        # [len(tokens), vocab]: the prefill, then one cached step per token
        kv, rows = self.prefill(prompt, variant).kv, []
        context = self.w["wpe.weight"].shape[0]
        for step, token in enumerate(tokens):
            position = variant.step_position(len(prompt), step)
            if not 0 <= position < context:
                raise Unsimulable(f"position {position}")
            f = oracle.extend([token], self.w, self.n_layer, kv, start=position, variant=variant)
            kv = f.kv
            rows.append(oracle.logits_at(f.hidden, self.w, [0], variant)[0])
        return np.stack(rows)


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


def simulate(check: str, args: list, w: dict, n_layer: int, variant: Variant = GPT2):
    """One case through a fresh CachedPath (tests hold the default variant to the oracle)."""
    return CachedPath(w, n_layer).answer(check, args, variant)
