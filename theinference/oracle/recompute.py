"""The recompute over one weights file: the answers every check compares with."""

import numpy as np

from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import ModelConfig


class Recompute:
    """The recompute (oracle.py) over one weights file, remembering its last few forwards (a
    stage's cases often share a prompt, e.g. prefill logits and prefill cache)."""

    def __init__(self, tensors: dict, config: ModelConfig):
        self.w = tensors
        self.config = config
        self._forwards: dict[tuple[int, ...], oracle.Forward] = {}

    def forward(self, ids: list[int]) -> oracle.Forward:
        key = tuple(ids)
        if key not in self._forwards:
            if len(self._forwards) >= 4:
                self._forwards.pop(next(iter(self._forwards)))
            self._forwards[key] = oracle.forward(ids, self.w, self.config.n_layer)
        return self._forwards[key]

    def last_logits(self, ids: list[int]) -> np.ndarray:
        # [vocab]: from a full forward if one is at hand, else from a last-row-only one
        full = self._forwards.get(tuple(ids))
        if full is not None:
            return oracle.logits_at(full.hidden, self.w, [len(ids) - 1])[0]
        f = oracle.forward(ids, self.w, self.config.n_layer, last_only=True)
        return oracle.logits_at(f.hidden, self.w, [0])[0]

    def layer0_attention_last(self, ids: list[int]) -> np.ndarray:
        # [d]: layer 0's attention-sublayer output (residual included) at the last position
        out, _ = oracle.attn_sublayer(oracle.embed(ids, self.w), self.w, 0)
        return out[-1]

    # --- the same answers along the cached path: their difference is the float32 noise -----

    def last_logits_cached_path(self, ids: list[int]) -> np.ndarray:
        # [vocab]: the prefix recomputed, then the last token through its cache
        if len(ids) == 1:  # no prefix: the same row inside a larger batch instead
            f = oracle.forward(ids + ids, self.w, self.config.n_layer)
            return oracle.logits_at(f.hidden, self.w, [0])[0]
        past = oracle.forward(ids[:-1], self.w, self.config.n_layer).kv
        f = oracle.extend(ids[-1:], self.w, self.config.n_layer, past)
        return oracle.logits_at(f.hidden, self.w, [0])[0]

    def layer0_attention_cached_path(self, ids: list[int]) -> np.ndarray:
        # [d]
        x = oracle.embed(ids, self.w)
        if len(ids) == 1:
            out, _ = oracle.attn_sublayer(oracle.embed(ids * 2, self.w), self.w, 0)
            return out[0]
        _, past = oracle.attn_sublayer(x[:-1], self.w, 0)
        out, _ = oracle.attn_sublayer(x[-1:], self.w, 0, past)
        return out[0]
