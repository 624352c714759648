"""The course's classic bugs, planted in the reference solution by plain text substitution.

Each entry: a stable id, the stage it must fail, and the exact edit. An edit whose `old` text
is not found exactly once is an error in this catalogue, so the planting cannot silently miss.
"""

from dataclasses import dataclass
from pathlib import Path

REFERENCE = Path(__file__).parent / "solutions" / "reference_kvcache.py"


@dataclass(frozen=True)
class Bug:
    id: str
    stage: str
    old: str
    new: str
    also: tuple[tuple[str, str], ...] = ()  # further edits the same bug needs
    fingerprint: str | None = None  # the catalogue id the grader must name it by, if any

    def planted(self) -> str:
        text = REFERENCE.read_text()
        for old, new in ((self.old, self.new), *self.also):
            count = text.count(old)
            if count != 1:
                raise AssertionError(
                    f"bug {self.id}: expected 1 occurrence of {old!r}, got {count}"
                )
            text = text.replace(old, new)
        return text


BUGS = [
    Bug(
        "decode-position-zero",  # wpe[0] for the new token
        "full-decode-step",
        "x = embed_token(token_id, position, w)",
        "x = embed_token(token_id, 0, w)",
        fingerprint="position-zero",
    ),
    Bug(
        "decode-position-one",  # a step counter starting at 1
        "full-decode-step",
        "x = embed_token(token_id, position, w)",
        "x = embed_token(token_id, 1, w)",
        fingerprint="position-one",
    ),
    Bug(
        "decode-position-after-append",  # the cache length after the append
        "full-decode-step",
        "x = embed_token(token_id, position, w)",
        "x = embed_token(token_id, position + 1, w)",
        fingerprint="position-after-append",
    ),
    Bug(
        "attend-old-length",  # the new token never attends to itself
        "single-step-attention",
        "keys, values = cache.k, cache.v",
        # (the first token still sees itself: there is nothing else to see)
        "old = max(cache.length - 1, 1)\n    keys, values = cache.k[:, :old], cache.v[:, :old]",
        fingerprint="attend-old-length",
    ),
    Bug(
        "causal-mask-in-step",  # a triangular mask dragged into the single-token step
        "single-step-attention",
        "a = merge_heads(softmax(scores) @ values)[0]",
        "scores = np.where(np.tri(1, keys.shape[1], dtype=bool), scores, -np.inf)\n"
        "    a = merge_heads(softmax(scores) @ values)[0]",
        fingerprint="causal-mask-in-step",
    ),
    Bug(
        "shared-cache",  # [LayerCache()] * n: one cache object for every layer
        "build-prefill",
        "self.layers = [LayerCache(heads) for _ in range(layers)]",
        "self.layers = [LayerCache(heads)] * layers",
        fingerprint="shared-cache",
    ),
    Bug(
        "shared-cache-in-decode",  # every layer reads and grows layer 0's cache
        "full-decode-step",
        "x = x + attn_step(h, w, layer, mc.layers[layer])",
        "x = x + attn_step(h, w, layer, mc.layers[0])",
        fingerprint="shared-cache-layer0",
    ),
    Bug(
        "missing-ln-f",
        "build-prefill",
        'return unembed(ln_rows(x[None, :], w["ln_f.weight"], w["ln_f.bias"])[0], w)',
        "return unembed(x, w)",
        fingerprint="missing-ln-f",
    ),
    Bug(
        "prefill-cache-short",  # one row short
        "build-prefill",
        "append_kv(cache, k, v)\n    n = X.shape[0]",
        "append_kv(cache, k[:, :-1], v[:, :-1])\n    n = X.shape[0]",
        fingerprint="prefill-cache-short",
    ),
    Bug(
        "prefill-cache-long",  # the last row written twice
        "build-prefill",
        "append_kv(cache, k, v)\n    n = X.shape[0]",
        "append_kv(cache, k, v)\n    append_kv(cache, k[:, -1:], v[:, -1:])\n    n = X.shape[0]",
        fingerprint="prefill-cache-long",
    ),
    Bug(
        "prefill-no-causal-mask",
        "build-prefill",
        "scores = np.where(np.tri(n, dtype=bool), scores, -np.inf)",
        "scores = scores",
        fingerprint="prefill-no-causal-mask",
    ),
    Bug(
        "prefill-position-zero",  # every prompt token embedded at wpe[0]
        "build-prefill",
        "X = np.stack([embed_token(t, i, w) for i, t in enumerate(prompt_ids)])",
        "X = np.stack([embed_token(t, 0, w) for i, t in enumerate(prompt_ids)])",
        fingerprint="prefill-position-zero",
    ),
]

BUGS += [
    Bug(
        "sequence-position-not-advancing",  # the decode position stays at len(prompt)
        "per-step-identity",
        "rows.append(decode_step(token_id, len(prompt_ids) + step, w, mc))",
        "rows.append(decode_step(token_id, len(prompt_ids), w, mc))",
        fingerprint="position-not-advancing",
    ),
    Bug(
        "sequence-handoff-off-by-one",  # every decode one position late
        "per-step-identity",
        "rows.append(decode_step(token_id, len(prompt_ids) + step, w, mc))",
        "rows.append(decode_step(token_id, len(prompt_ids) + step + 1, w, mc))",
        fingerprint="position-after-append",
    ),
    Bug(
        "generate-position-from-zero",  # a step counter instead of the absolute position
        "generate-loop",
        "logits = decode_step(out[-1], len(prompt_ids) + step, w, mc)",
        "logits = decode_step(out[-1], step, w, mc)",
    ),
    Bug(
        "generate-one-too-many",
        "generate-loop",
        "for step in range(max_new_tokens):",
        "for step in range(max_new_tokens + 1):",
    ),
    Bug(
        "generate-no-context-check",  # indexes past wpe instead of raising
        "generate-loop",
        'if len(prompt_ids) + max_new_tokens > w["wpe.weight"].shape[0]:',
        "if False:",
    ),
    Bug(
        "prefix-reuses-last-token",
        "prefix-caching",
        "reused = min(best, len(prompt_ids) - 1)",
        "reused = best",
    ),
    Bug(
        "prefix-match-off-by-one",
        "prefix-caching",
        "reused = min(best, len(prompt_ids) - 1)",
        "reused = max(min(best, len(prompt_ids) - 1) - 1, 0)",
    ),
    Bug(
        "prefix-suffix-positions-from-zero",
        "prefix-caching",
        "logits = decode_step(prompt_ids[position], position, w, mc)",
        "logits = decode_step(prompt_ids[position], position - reused, w, mc)",
    ),
    Bug(
        "prefix-cache-mutated-in-place",  # the earlier prompt's cache truncated and regrown
        "prefix-caching",
        "mc = copy_prefix(source, reused, n_head(w))",
        "mc = source\n"
        "            for layer in mc.layers:\n"
        "                layer.k, layer.v = layer.k[:, :reused], layer.v[:, :reused]",
    ),
]

BUGS += [
    Bug(
        "decode-recomputes",  # right logits, quadratic cost: the cache is never read
        "full-decode-step",
        "def decode_step(token_id, position, w, mc):\n    x = embed_token(token_id, position, w)",
        "def decode_step(token_id, position, w, mc):\n"
        "    history = getattr(mc, 'history', [])\n"
        "    mc.history = history + [token_id]\n"
        "    return recompute_logits(mc.prompt + mc.history, w)[-1]\n"
        "    x = embed_token(token_id, position, w)",
        also=(
            (
                "def prefill(prompt_ids, w, mc):\n",
                "def prefill(prompt_ids, w, mc):\n    mc.prompt = list(prompt_ids)\n",
            ),
        ),
        fingerprint="decode-recomputes",
    ),
]
