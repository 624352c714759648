"""Correct caches made slow in the ways real ones are, which a floor alone failed (generate-loop
at about 8x the reference's cost, prefix-caching at about 4x): the reference solution with its
decode's attention and unembedding replaced. Never shipped to students."""

from tests.helpers import reference_text

# every use of the cache and of the weights cast to float64
FLOAT64_TAIL = '''


def attend(q, cache, w, layer):
    # correct, and slow: the cache and the weights cast to float64 at every use
    keys, values = cache.k.astype(np.float64), cache.v.astype(np.float64)
    scores = q.astype(np.float64) @ keys.transpose(0, 2, 1) / math.sqrt(HEAD_DIM)
    a = merge_heads(softmax(scores) @ values)[0]
    proj = w[f"h.{layer}.attn.c_proj.weight"].astype(np.float64)
    return (a @ proj + w[f"h.{layer}.attn.c_proj.bias"]).astype(np.float32)


def final_logits(x, w):
    h = ln_rows(x[None, :], w["ln_f.weight"], w["ln_f.bias"])[0].astype(np.float64)
    return (h @ w["wte.weight"].astype(np.float64).T).astype(np.float32)
'''

# several common slownesses at once: float64, the cache stacked anew and the unembedding
# transposed into a copy at every step, each head and each position in a Python loop
SLOWNESSES_TAIL = '''


def attend(q, cache, w, layer):
    # correct, and slow in several common ways at once
    kv = np.stack([cache.k, cache.v]).astype(np.float64)  # [2, heads, length, head_dim]
    heads, length = kv.shape[1], kv.shape[2]
    out = np.zeros((heads, HEAD_DIM))
    for h in range(heads):
        scores = np.array([float(q[h, 0] @ kv[0, h, t]) for t in range(length)])
        p = np.exp(scores / math.sqrt(HEAD_DIM) - scores.max() / math.sqrt(HEAD_DIM))
        p /= p.sum()
        for t in range(length):
            out[h] += p[t] * kv[1, h, t]
    proj = w[f"h.{layer}.attn.c_proj.weight"].astype(np.float64)
    return (out.reshape(-1) @ proj + w[f"h.{layer}.attn.c_proj.bias"]).astype(np.float32)


def final_logits(x, w):
    unembedding = w["wte.weight"].T.copy()  # [d, vocab], every step
    h = ln_rows(x[None, :], w["ln_f.weight"], w["ln_f.bias"])[0].astype(np.float64)
    return (h @ unembedding.astype(np.float64)).astype(np.float32)
'''

SLOW_CACHES = {"float64": FLOAT64_TAIL, "slownesses": SLOWNESSES_TAIL}


def slow_cache(name: str) -> str:
    return reference_text() + SLOW_CACHES[name]
