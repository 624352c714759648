"""Your KV cache for GPT-2. Each stub raises NotImplementedError until you write it.

Grade a stage with `theinference test --stage <slug> --watch` from the course directory.
From src/gpt2.py, reuse ln_rows, qkv, mlp and unembed as they are. Two things change:
attention reads and grows a cache, and positions. `embed` places a sequence at positions
0..n-1, from its start: right for a prompt, wrong for a decoded token, which goes at its
absolute position (embed_token(token_id, len(prompt_ids) + step, w), never wpe[0]).
"""

import numpy as np

from src.gpt2 import (  # noqa: F401  (the building blocks you will need)
    HEAD_DIM,
    embed,
    gelu,
    ln_rows,
    load_weights,
    merge_heads,
    mlp,
    n_head,
    n_layer,
    qkv,
    softmax,
    split_heads,
    unembed,
)


class LayerCache:
    """One layer's K/V history. k and v are [n_head, length, head_dim]."""

    def __init__(self, heads: int = 12):
        self.k = np.zeros((heads, 0, HEAD_DIM), dtype=np.float32)
        self.v = np.zeros((heads, 0, HEAD_DIM), dtype=np.float32)

    @property
    def length(self) -> int:
        return self.k.shape[1]


class ModelCache:
    """One LayerCache per layer: layer l reads and grows mc.layers[l] only."""

    def __init__(self, layers: int = 12, heads: int = 12):
        self.layers = [LayerCache(heads) for _ in range(layers)]


# --- stage single-step-attention -------------------------------------------------------------


def attn_step(ln_hidden: np.ndarray, w: dict, layer: int, cache: LayerCache) -> np.ndarray:
    """[d] ln_1 output of ONE new token -> [d] attention contribution a (no residual).

    Project through qkv, append the new K/V to the cache, then per head attend the new Q over
    every cached row (the new one included), scale 1/sqrt(64), softmax, weight V, merge the
    heads and apply attn.c_proj.
    """
    raise NotImplementedError("single-step-attention: implement attn_step in src/kvcache.py")


def layer_attn_incremental(X: np.ndarray, w: dict, layer: int) -> np.ndarray:
    """[n, d] layer inputs -> [n, d] attention-sublayer outputs (X[t] + a), one token at a time
    through a fresh LayerCache."""
    raise NotImplementedError(
        "single-step-attention: implement layer_attn_incremental in src/kvcache.py"
    )


# --- stage build-prefill ---------------------------------------------------------------------


def embed_token(token_id: int, position: int, w: dict) -> np.ndarray:
    """[d]: wte[token_id] + wpe[position], position being the token's ABSOLUTE index."""
    raise NotImplementedError("build-prefill: implement embed_token in src/kvcache.py")


def prefill(prompt_ids: list[int], w: dict, mc: ModelCache) -> np.ndarray:
    """Run the prompt through every layer under the causal mask, leave exactly len(prompt_ids)
    rows in every layer's cache, and return the last position's [vocab] logits."""
    raise NotImplementedError("build-prefill: implement prefill in src/kvcache.py")


# --- stage full-decode-step ------------------------------------------------------------------


def block_step(x: np.ndarray, w: dict, layer: int, mc: ModelCache) -> np.ndarray:
    """[d] -> [d]: ln_1 -> attn_step (reads and grows mc.layers[layer]) -> ln_2 -> mlp."""
    raise NotImplementedError("full-decode-step: implement block_step in src/kvcache.py")


def decode_step(token_id: int, position: int, w: dict, mc: ModelCache) -> np.ndarray:
    """One new token at absolute `position` through every layer, then ln_f and the tied
    unembed: [vocab] next-token logits."""
    raise NotImplementedError("full-decode-step: implement decode_step in src/kvcache.py")


# --- stage per-step-identity -----------------------------------------------------------------


def decode_sequence(
    prompt_ids: list[int], continuation_ids: list[int], w: dict, mc: ModelCache
) -> np.ndarray:
    """Prefill the prompt into mc, then decode each continuation token in turn at positions
    len(prompt_ids), len(prompt_ids) + 1, ...: [len(continuation_ids), vocab] logits, one row
    per step."""
    raise NotImplementedError("per-step-identity: implement decode_sequence in src/kvcache.py")


# --- stage generate-loop ---------------------------------------------------------------------


def generate(prompt_ids: list[int], max_new_tokens: int, w: dict) -> list[int]:
    """Greedy generation through the cache: exactly max_new_tokens new ids (not the prompt).

    Raise ValueError when len(prompt_ids) + max_new_tokens exceeds the context
    (w["wpe.weight"].shape[0] = 1024 positions): there is no position to put them at. Check it
    first, before prefill: a guard met later, deep in the decode, refuses too late.
    """
    raise NotImplementedError("generate-loop: implement generate in src/kvcache.py")


# --- stage prefix-caching --------------------------------------------------------------------


class PrefixCache:
    """Keeps the K/V of prompts already processed, so a new prompt that shares a prefix with
    any earlier one computes only what is new."""

    def __init__(self, w: dict):
        self.w = w

    def process(self, prompt_ids: list[int]) -> tuple[np.ndarray, int]:
        """-> ([vocab] logits of the prompt's last position, positions reused from the cache).

        Reuse min(longest common prefix with any earlier prompt, len(prompt_ids) - 1)
        positions, on a COPY of those rows; compute the rest at positions reused, reused + 1...
        """
        raise NotImplementedError("prefix-caching: implement PrefixCache.process in src/kvcache.py")
