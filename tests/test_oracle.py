"""The oracle against an independent implementation (Hugging Face transformers' GPT-2 in
PyTorch) on the same weights, and its own float32 discipline."""

import os

import numpy as np
import pytest

from tests.helpers import hf_gpt2, oracle_answer
from theinference.curriculum.stages import token_ids
from theinference.oracle import gpt2 as oracle

# one worker runs this file: the transformers model built once (`hf_model`) serves every test here
pytestmark = pytest.mark.xdist_group("test_oracle")


def import_transformers():
    # CI installs torch and transformers (.ci/run), where a skip would hide a broken oracle
    if os.environ.get("CI"):
        import torch
        import transformers
    else:
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
    return torch, transformers


@pytest.fixture(scope="module")
def hf_model(weights):
    torch, transformers = import_transformers()
    return torch, hf_gpt2(weights, torch, transformers)


@pytest.mark.parametrize("length", [1, 37, 256])
def test_oracle_matches_transformers(hf_model, weights, length):
    torch, model = hf_model
    ids = token_ids({"random": length, "seed": 11}, weights.config)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True, output_hidden_states=True)
    theirs = out.logits[0].numpy()  # [n, vocab]
    f = oracle.forward(ids, weights.tensors, weights.config.n_layer)
    ours = oracle.logits_at(f.hidden, weights.tensors, list(range(length)))
    # 1e-3/1e-2 is the grading tolerance; the two implementations agree far inside it
    assert np.abs(ours - theirs).max() < 2e-4
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    # K/V per layer: transformers' cache is [batch, heads, n, head_dim]
    kv = out.past_key_values
    for layer in (0, 5, 11):
        k, v = (
            kv[layer] if isinstance(kv, tuple) else (kv.layers[layer].keys, kv.layers[layer].values)
        )
        np.testing.assert_allclose(f.kv[layer].k, k[0].numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(f.kv[layer].v, v[0].numpy(), atol=1e-4, rtol=1e-4)


def test_oracle_stays_float32(weights):
    ids = [1, 2, 3]
    f = oracle.forward(ids, weights.tensors, weights.config.n_layer)
    assert f.hidden.dtype == np.float32
    assert all(kv.k.dtype == np.float32 and kv.v.dtype == np.float32 for kv in f.kv)
    assert oracle.logits_at(f.hidden, weights.tensors, [2]).dtype == np.float32
    out, _ = oracle.attn_sublayer(oracle.embed(ids, weights.tensors), weights.tensors, 0)
    assert out.dtype == np.float32


def test_oracle_is_causal(weights):
    # a later token never changes an earlier position's output
    w, n_layer = weights.tensors, weights.config.n_layer
    a = oracle.forward([5, 6, 7, 8], w, n_layer).hidden
    b = oracle.forward([5, 6, 7, 9000], w, n_layer).hidden
    np.testing.assert_allclose(a[:3], b[:3], atol=1e-5)
    assert np.abs(a[3] - b[3]).max() > 0.1


def test_synthetic_greedy_generation_does_not_collapse(weights):
    w, n_layer = weights.tensors, weights.config.n_layer
    for prompt in ([464, 2068, 7586], [0], [50256, 50256]):
        ids = list(prompt)
        for _ in range(32):
            f = oracle.forward(ids, w, n_layer)
            ids.append(int(oracle.logits_at(f.hidden, w, [len(ids) - 1])[0].argmax()))
        assert len(set(ids[len(prompt) :])) >= 24, ids


CASES = [
    ("step_attention", [[5, 6, 7, 8]]),
    ("step_attention", [[5]]),
    ("prefill_logits", [[5, 6, 7, 8]]),
    ("decode_step", [[5, 6, 7], 8]),
    ("decode_step", [[5], 8]),
    ("decode_sequence", [[5, 6], [7, 8, 9]]),
]


def cached_path_by_hand(check: str, args: list, w: dict, n: int) -> np.ndarray:
    """The oracle's own cached path, written out: a prefill in one pass, then one extend per
    token; one token attends over a cache of no rows, which is attending over itself alone."""
    if check == "step_attention":
        x = oracle.embed(args[0], w)
        if len(args[0]) == 1:
            return oracle.attn_sublayer(x, w, 0)[0][-1]
        _, past = oracle.attn_sublayer(x[:-1], w, 0)
        return oracle.attn_sublayer(x[-1:], w, 0, past)[0][0]
    f = oracle.forward(args[0], w, n)
    if check == "prefill_logits":
        return oracle.logits_at(f.hidden, w, [-1])[0]
    rows = []
    for token in [args[1]] if check == "decode_step" else args[1]:
        f = oracle.extend([token], w, n, f.kv)
        rows.append(oracle.logits_at(f.hidden, w, [0])[0])
    return rows[0] if check == "decode_step" else np.stack(rows)


@pytest.mark.parametrize("check,args", CASES)
def test_the_correct_variant_is_the_oracle(weights, check, args):
    """Catches fingerprints measured against a model that is not the oracle: with no bug
    replaced, the simulated student's path is the oracle's cached path bit for bit, and the
    full recompute within float32 noise."""
    from theinference.curriculum.checks import CHECKS
    from theinference.oracle.cached_path import CachedPath

    w, n = weights.tensors, weights.config.n_layer
    ours = CachedPath(w, n).answer(CHECKS[check].simulate, args)
    np.testing.assert_array_equal(ours, cached_path_by_hand(check, args, w, n))
    full = oracle_answer(check, args, w, n)
    np.testing.assert_allclose(ours, full, atol=2e-4, rtol=1e-3)


def load_template_gpt2():
    import importlib.util
    from pathlib import Path

    path = Path(oracle.__file__).parents[1] / "course" / "templates" / "python" / "src" / "gpt2.py"
    spec = importlib.util.spec_from_file_location("template_gpt2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONTRACT = ["embed", "ln_rows", "qkv", "attn_sublayer", "mlp", "block", "unembed",
            "recompute_logits", "gelu", "softmax", "split_heads", "merge_heads"]  # fmt: skip


def test_the_template_and_the_oracle_are_one_gpt2(weights):
    """Catches the student's provided gpt2.py and the oracle drifting apart in names or
    numbers: the contract's building blocks exist in both, the MLP is without its residual in
    both, and the two recomputes agree far inside the grading tolerance."""
    template = load_template_gpt2()
    assert all(callable(getattr(m, name, None)) for m in (template, oracle) for name in CONTRACT)
    w, n = weights.tensors, weights.config.n_layer
    ids = [464, 2068, 7586, 21831, 18045]
    x = oracle.embed(ids, w)
    np.testing.assert_allclose(template.embed(ids, w), x)
    h = oracle.ln_rows(x, w["h.0.ln_2.weight"], w["h.0.ln_2.bias"])
    np.testing.assert_allclose(template.mlp(h, w, 0), oracle.mlp(h, w, 0), atol=1e-4, rtol=1e-4)
    ours, _ = oracle.attn_sublayer(x, w, 0)
    np.testing.assert_allclose(template.attn_sublayer(x, w, 0), ours, atol=1e-5, rtol=1e-4)
    theirs = template.recompute_logits(ids, w)
    np.testing.assert_allclose(theirs, oracle.recompute_logits(ids, w, n), atol=2e-4, rtol=1e-3)


def test_extend_equals_forward_and_greedy_follows_argmax(weights):
    w, n = weights.tensors, weights.config.n_layer
    ids = list(range(300, 340))
    whole = oracle.forward(ids, w, n)
    part = oracle.extend(ids[25:], w, n, oracle.forward(ids[:25], w, n).kv)
    np.testing.assert_allclose(part.hidden, whole.hidden[25:], atol=2e-4, rtol=1e-4)
    for a, b in zip(part.kv, whole.kv, strict=True):
        np.testing.assert_allclose(a.k, b.k, atol=1e-4)
    tokens = oracle.greedy(oracle.forward(ids[:5], w, n), 6, w, n)
    for i, t in enumerate(tokens):  # each greedy token is the plain recompute's argmax
        f = oracle.forward(ids[:5] + tokens[:i], w, n)
        assert t == int(oracle.logits_at(f.hidden, w, [-1])[0].argmax())
