"""A second correct solution, written from the course contract alone and unlike the reference:
float64 arithmetic, preallocated cache buffers with a fill counter, Python loops over heads.
If the grader accepts both, it is not merely accepting the reference's rounding."""

import numpy as np
from src.gpt2 import HEAD_DIM, n_head, n_layer

MAX_CTX = 1024


def _ln(x, g, b):
    # [d] -> [d], in float64
    x = np.asarray(x, dtype=np.float64)
    mu = x.mean()
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean() + 1e-5) * g + b


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


class LayerCache:
    def __init__(self, heads: int = 12):
        self._k = np.zeros((heads, MAX_CTX, HEAD_DIM))
        self._v = np.zeros((heads, MAX_CTX, HEAD_DIM))
        self.length = 0

    @property
    def k(self):
        return self._k[:, : self.length]

    @property
    def v(self):
        return self._v[:, : self.length]

    def push(self, k_row, v_row):
        # k_row, v_row: [heads, head_dim]
        self._k[:, self.length] = k_row
        self._v[:, self.length] = v_row
        self.length += 1


class ModelCache:
    def __init__(self, layers: int = 12, heads: int = 12):
        self.layers = [LayerCache(heads) for _ in range(layers)]


def attn_step(ln_hidden, w, layer, cache):
    p = f"h.{layer}.attn."
    heads = n_head(w)
    qkv_row = np.asarray(ln_hidden, np.float64) @ w[p + "c_attn.weight"] + w[p + "c_attn.bias"]
    q, k, v = (part.reshape(heads, HEAD_DIM) for part in np.split(qkv_row, 3))
    cache.push(k, v)
    out = np.empty((heads, HEAD_DIM))
    for h in range(heads):
        s = cache.k[h] @ q[h] / np.sqrt(HEAD_DIM)  # [length]
        e = np.exp(s - s.max())
        out[h] = (e / e.sum()) @ cache.v[h]
    return out.reshape(-1) @ w[p + "c_proj.weight"] + w[p + "c_proj.bias"]


def layer_attn_incremental(X, w, layer):
    cache = LayerCache(n_head(w))
    g, b = w[f"h.{layer}.ln_1.weight"], w[f"h.{layer}.ln_1.bias"]
    return np.array([x + attn_step(_ln(x, g, b), w, layer, cache) for x in X])


def embed_token(token_id, position, w):
    return w["wte.weight"][token_id].astype(np.float64) + w["wpe.weight"][position]


def block_step(x, w, layer, mc):
    p = f"h.{layer}."
    x = x + attn_step(_ln(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"]), w, layer, mc.layers[layer])
    h = _ln(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
    up = _gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
    return x + up @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]


def decode_step(token_id, position, w, mc):
    x = embed_token(token_id, position, w)
    for layer in range(n_layer(w)):
        x = block_step(x, w, layer, mc)
    # float32 against the float32 weights: a float64 vector would convert all of wte each step
    return w["wte.weight"] @ _ln(x, w["ln_f.weight"], w["ln_f.bias"]).astype(np.float32)


def _ln_rows(X, g, b):
    # [n, d] -> [n, d]
    mu = X.mean(axis=1, keepdims=True)
    return (X - mu) / np.sqrt(((X - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5) * g + b


def prefill(prompt_ids, w, mc):
    n, heads = len(prompt_ids), n_head(w)
    X = np.array([embed_token(t, i, w) for i, t in enumerate(prompt_ids)])  # [n, d]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    for layer in range(n_layer(w)):
        p = f"h.{layer}."
        H = _ln_rows(X, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        Q, K, V = np.split(H @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"], 3, axis=1)
        heads_out = []
        for h in range(heads):
            cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
            s = Q[:, cols] @ K[:, cols].T / np.sqrt(HEAD_DIM)  # [n, n]
            s[future] = -np.inf
            e = np.exp(s - s.max(axis=1, keepdims=True))
            heads_out.append((e / e.sum(axis=1, keepdims=True)) @ V[:, cols])
        for t in range(n):  # one cache row per prompt position
            mc.layers[layer].push(K[t].reshape(heads, HEAD_DIM), V[t].reshape(heads, HEAD_DIM))
        X = X + np.hstack(heads_out) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        H2 = _ln_rows(X, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        up = _gelu(H2 @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        X = X + up @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return w["wte.weight"] @ _ln(X[-1], w["ln_f.weight"], w["ln_f.bias"])


def decode_sequence(prompt_ids, continuation_ids, w, mc):
    prefill(prompt_ids, w, mc)
    position = len(prompt_ids)
    out = []
    for token_id in continuation_ids:
        out.append(decode_step(token_id, position, w, mc))
        position += 1
    return out  # a list of rows: the contract accepts lists


def generate(prompt_ids, max_new_tokens, w):
    n_ctx = w["wpe.weight"].shape[0]
    if len(prompt_ids) + max_new_tokens > n_ctx:
        raise ValueError(f"{len(prompt_ids)} + {max_new_tokens} tokens exceed the {n_ctx} context")
    mc = ModelCache(n_layer(w), n_head(w))
    logits, new = prefill(prompt_ids, w, mc), []
    while len(new) < max_new_tokens:
        new.append(int(np.argmax(logits)))
        if len(new) < max_new_tokens:
            logits = decode_step(new[-1], len(prompt_ids) + len(new) - 1, w, mc)
    return np.array(new)  # an int array: also accepted


class PrefixCache:
    def __init__(self, w):
        self.w = w
        self.seen = []  # (ids, [(k, v) per layer]) with private copies

    def process(self, prompt_ids):
        w, heads = self.w, n_head(self.w)
        match, rows = 0, None
        for ids, layers in self.seen:
            n = next(
                (i for i, (a, b) in enumerate(zip(ids, prompt_ids, strict=False)) if a != b),
                min(len(ids), len(prompt_ids)),
            )
            if n > match:
                match, rows = n, layers
        reuse = min(match, len(prompt_ids) - 1)
        mc = ModelCache(n_layer(w), heads)
        if reuse:
            for cache, (k, v) in zip(mc.layers, rows, strict=True):
                for t in range(reuse):
                    cache.push(k[:, t], v[:, t])
            for t in range(reuse, len(prompt_ids)):
                logits = decode_step(prompt_ids[t], t, w, mc)
        else:
            logits = prefill(prompt_ids, w, mc)
        self.seen.append((list(prompt_ids), [(c.k.copy(), c.v.copy()) for c in mc.layers]))
        return logits, reuse
