"""A correct solution whose cache lives in a PyTorch module, after the cached
MultiHeadAttention of the "Build a Large Language Model (From Scratch)" book: each layer's
attention is an nn.Module holding its K/V in two buffers (`register_buffer("cache_k", None,
persistent=False)`), [batch, tokens, n_head, head_dim], grown with torch.cat along the token
axis, with `ptr_current_pos` (the absolute position of the next token) and `reset_cache()`.
A LayerCache IS that module: `attn_step(ln_hidden, w, layer, cache)` calls `cache(x)`. Layer
norms and the MLP stay NumPy (the building blocks of src/gpt2.py). Never shipped to students."""

import math
import warnings

import numpy as np
import torch
from src.gpt2 import HEAD_DIM, ln_rows, mlp, n_head, n_layer, unembed
from torch import nn

torch.set_grad_enabled(False)  # inference only: no autograd graph behind the cache
# one thread, as NumPy's BLAS gets: idle OpenMP threads spin on a busy machine, and CPU time is
# what the grader measures
torch.set_num_threads(1)
# the weights are memory-mapped read-only; torch views them without a copy and never writes
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def tensor(w: dict, name: str) -> torch.Tensor:
    # a zero-copy torch view of one weight array
    return torch.from_numpy(w[name])


class MultiHeadAttention(nn.Module):
    """GPT-2's causal self-attention for one layer, with its KV cache in the module's buffers."""

    def __init__(self, num_heads: int = 12):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, HEAD_DIM
        self.layer: int | None = None  # set by load(): whose projections this module applies
        self.register_buffer("cache_k", None, persistent=False)  # [1, tokens, heads, head_dim]
        self.register_buffer("cache_v", None, persistent=False)
        self.ptr_current_pos = 0

    def load(self, w: dict, layer: int) -> None:
        # this layer's c_attn and c_proj, Conv1D [in, out] so a projection is x @ W + b
        p = f"h.{layer}.attn."
        self.c_attn_w, self.c_attn_b = tensor(w, p + "c_attn.weight"), tensor(w, p + "c_attn.bias")
        self.c_proj_w, self.c_proj_b = tensor(w, p + "c_proj.weight"), tensor(w, p + "c_proj.bias")
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [tokens, d] (already layer-normed, at positions ptr_current_pos ..) -> [tokens, d]
        num_tokens, d = x.shape
        queries, keys_new, values_new = (x @ self.c_attn_w + self.c_attn_b).split(d, dim=-1)
        shape = (1, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(shape)
        keys_new, values_new = keys_new.view(shape), values_new.view(shape)

        if self.cache_k is None:
            self.cache_k, self.cache_v = keys_new, values_new
        else:
            self.cache_k = torch.cat([self.cache_k, keys_new], dim=1)
            self.cache_v = torch.cat([self.cache_v, values_new], dim=1)
        keys, values = self.cache_k, self.cache_v  # [1, tokens_so_far, heads, head_dim]

        queries, keys, values = (t.transpose(1, 2) for t in (queries, keys, values))
        attn_scores = queries @ keys.transpose(2, 3)  # [1, heads, num_tokens, tokens_so_far]
        # query i sits at position ptr_current_pos + i and sees keys 0 .. ptr_current_pos + i
        mask = torch.ones(num_tokens, keys.shape[2], dtype=torch.bool)
        mask = mask.triu(diagonal=self.ptr_current_pos + 1)
        self.ptr_current_pos += num_tokens
        attn_scores.masked_fill_(mask, -torch.inf)
        attn_weights = torch.softmax(attn_scores / math.sqrt(self.head_dim), dim=-1)

        context = (attn_weights @ values).transpose(1, 2).reshape(num_tokens, d)
        return context @ self.c_proj_w + self.c_proj_b

    def reset_cache(self) -> None:
        self.cache_k, self.cache_v = None, None
        self.ptr_current_pos = 0

    @property
    def length(self) -> int:
        return self.ptr_current_pos

    @property
    def k(self) -> torch.Tensor:
        # [heads, length, head_dim], as the adapters return it
        if self.cache_k is None:
            return torch.zeros(self.num_heads, 0, self.head_dim)
        return self.cache_k[0].transpose(0, 1)

    @property
    def v(self) -> torch.Tensor:
        if self.cache_v is None:
            return torch.zeros(self.num_heads, 0, self.head_dim)
        return self.cache_v[0].transpose(0, 1)


LayerCache = MultiHeadAttention  # a layer's cache is its attention module


class ModelCache(nn.Module):
    def __init__(self, layers: int = 12, heads: int = 12):
        super().__init__()
        self.layers = nn.ModuleList([MultiHeadAttention(heads) for _ in range(layers)])

    def reset_cache(self) -> None:
        for attention in self.layers:
            attention.reset_cache()


def attention(cache: MultiHeadAttention, h: np.ndarray, w: dict, layer: int) -> np.ndarray:
    # h [tokens, d] layer-normed rows through the layer's attention module -> [tokens, d]
    if cache.layer != layer:
        cache.load(w, layer)
    return cache(torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))).numpy()


def attn_step(ln_hidden, w, layer, cache):
    # cache is the layer's attention module: one token in, its K/V appended to the buffers
    return attention(cache, ln_hidden[None, :], w, layer)[0]


def layer_attn_incremental(X, w, layer):
    p = f"h.{layer}."
    cache = MultiHeadAttention(n_head(w))
    out = []
    for t in range(X.shape[0]):
        h = ln_rows(X[t : t + 1], w[p + "ln_1.weight"], w[p + "ln_1.bias"])[0]
        out.append(X[t] + attn_step(h, w, layer, cache))
    return np.stack(out)


def embed_token(token_id, position, w):
    return w["wte.weight"][token_id] + w["wpe.weight"][position]


def prefill_layer(X, w, layer, cache):
    # [n, d] -> [n, d]: one block over the whole prompt, the module caching its K/V
    p = f"h.{layer}."
    h = ln_rows(X, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
    X = X + attention(cache, h, w, layer)  # causal: the module masks by absolute position
    return X + mlp(ln_rows(X, w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer)


def final_logits(x, w):
    # [d] -> [vocab]
    return unembed(ln_rows(x[None, :], w["ln_f.weight"], w["ln_f.bias"])[0], w)


def prefill(prompt_ids, w, mc):
    X = np.stack([embed_token(t, i, w) for i, t in enumerate(prompt_ids)])
    for layer in range(n_layer(w)):
        X = prefill_layer(X, w, layer, mc.layers[layer])
    return final_logits(X[-1], w)


def block_step(x, w, layer, mc):
    p = f"h.{layer}."
    h = ln_rows(x[None, :], w[p + "ln_1.weight"], w[p + "ln_1.bias"])[0]
    x = x + attn_step(h, w, layer, mc.layers[layer])
    return x + mlp(ln_rows(x[None, :], w[p + "ln_2.weight"], w[p + "ln_2.bias"]), w, layer)[0]


def decode_step(token_id, position, w, mc):
    x = embed_token(token_id, position, w)
    for layer in range(n_layer(w)):
        x = block_step(x, w, layer, mc)
    return final_logits(x, w)


def decode_sequence(prompt_ids, continuation_ids, w, mc):
    prefill(prompt_ids, w, mc)
    rows = []
    for step, token_id in enumerate(continuation_ids):
        rows.append(decode_step(token_id, len(prompt_ids) + step, w, mc))
    return np.stack(rows)


def generate(prompt_ids, max_new_tokens, w):
    if len(prompt_ids) + max_new_tokens > w["wpe.weight"].shape[0]:
        raise ValueError("prompt plus new tokens exceed the context")
    mc = ModelCache(n_layer(w), n_head(w))
    logits = prefill(prompt_ids, w, mc)
    out = []
    for step in range(max_new_tokens):
        out.append(int(np.argmax(logits)))
        if step + 1 < max_new_tokens:
            logits = decode_step(out[-1], len(prompt_ids) + step, w, mc)
    return out


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def copy_prefix(mc, rows, heads):
    out = ModelCache(len(mc.layers), heads)
    for src, dst in zip(mc.layers, out.layers, strict=True):
        dst.cache_k = src.cache_k[:, :rows].clone()  # [1, rows, heads, head_dim]
        dst.cache_v = src.cache_v[:, :rows].clone()
        dst.ptr_current_pos = rows
    return out


class PrefixCache:
    def __init__(self, w):
        self.w = w
        self.entries = []  # (prompt ids, ModelCache holding all of its positions)

    def process(self, prompt_ids):
        w = self.w
        best, source = 0, None
        for ids, cached in self.entries:
            n = common_prefix(ids, prompt_ids)
            if n > best:
                best, source = n, cached
        reused = min(best, len(prompt_ids) - 1)
        if reused == 0:
            mc = ModelCache(n_layer(w), n_head(w))
            logits = prefill(prompt_ids, w, mc)
        else:
            mc = copy_prefix(source, reused, n_head(w))
            for position in range(reused, len(prompt_ids)):
                logits = decode_step(prompt_ids[position], position, w, mc)
        self.entries.append((list(prompt_ids), mc))
        return logits, reused
