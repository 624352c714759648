"""The recompute over one weights file: the answers every check compares with."""

import numpy as np

from theinference.oracle import gpt2 as oracle
from theinference.oracle.config import ModelConfig


class Recompute:
    """The recompute (gpt2.py) over one weights file, remembering its last few forwards (a
    stage's cases often share a prompt, e.g. prefill logits and prefill cache)."""

    def __init__(self, tensors: dict, config: ModelConfig):
        self.w = tensors
        self.config = config
        self._forwards: dict[tuple[int, ...], oracle.Forward] = {}

    def forward(self, ids: list[int]) -> oracle.Forward:
        key = tuple(ids)
        found = self._forwards.get(key)  # (read once: a planner thread may evict beside)
        if found is None:
            for oldest in list(self._forwards)[:-3]:  # the last three stay
                self._forwards.pop(oldest, None)
            found = self._forwards[key] = oracle.forward(ids, self.w, self.config.n_layer)
        return found

    def kv_of(self, ids: list[int]) -> list[oracle.LayerKV]:
        """Each layer's K/V over `ids`, [h, n, hd]: the first rows of a remembered forward
        that begins with them (a causal forward's first rows depend on its first tokens
        alone), else a forward's."""
        n, wanted = len(ids), tuple(ids)
        for key, found in list(self._forwards.items()):
            if key[:n] == wanted:
                return [oracle.LayerKV(k=kv.k[:, :n], v=kv.v[:, :n]) for kv in found.kv]
        return self.forward(ids).kv

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
