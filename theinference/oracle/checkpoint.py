"""A GPT-2 checkpoint's layout: the canonical tensors the grader and the student's process use
(no `transformer.` prefix, no mask buffers or tied lm_head, float32), its shapes inferred from
the embeddings and checked against GPT-2's, and the error that says why a file cannot be used."""

import re
from pathlib import Path

import numpy as np

from theinference.oracle.config import ModelConfig, expected_shapes

BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not weights


class WeightsError(Exception):
    """The weights cannot be used; the message says why and what to do instead."""


def canonicalise(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Strip `transformer.`, drop mask buffers and the tied lm_head, make every tensor float32."""
    out = {}
    for key, value in tensors.items():
        name = key.removeprefix("transformer.")
        if name.endswith(BUFFER_SUFFIXES) or name == "lm_head.weight":
            continue
        if value.dtype != np.float32:
            value = value.astype(np.float32)
        out[name] = value
    return out


def is_canonical(original: dict, canonical: dict) -> bool:
    return original.keys() == canonical.keys() and all(
        original[k].dtype == np.float32 for k in original
    )


def infer_config(tensors: dict[str, np.ndarray], path: Path) -> ModelConfig:
    """n_layer from the h.N blocks; n_embd, vocab and n_ctx from the embedding shapes."""
    for needed in ("wte.weight", "wpe.weight"):
        if needed not in tensors:
            raise WeightsError(f"{path}: missing tensor {needed!r}: is this a GPT-2 checkpoint?")
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"h\.(\d+)\.", k))}
    if not layers:
        raise WeightsError(f"{path}: no transformer blocks (h.0...) found")
    vocab, n_embd = tensors["wte.weight"].shape
    if tensors["wpe.weight"].ndim != 2 or n_embd % 64:
        raise WeightsError(f"{path}: embedding width {n_embd} is not a multiple of 64")
    return ModelConfig(
        n_layer=max(layers) + 1,
        n_embd=n_embd,
        vocab_size=vocab,
        n_ctx=tensors["wpe.weight"].shape[0],
    )


def check_shapes(tensors: dict[str, np.ndarray], config: ModelConfig, path: Path) -> None:
    """Every expected tensor present with its exact shape, and nothing else."""
    want = expected_shapes(config)
    missing = sorted(want.keys() - tensors.keys())
    extra = sorted(tensors.keys() - want.keys())
    if missing:
        raise WeightsError(f"{path}: missing tensor(s) {', '.join(missing[:5])}")
    if extra:
        raise WeightsError(f"{path}: unexpected tensor(s) {', '.join(extra[:5])}")
    for name, shape in want.items():
        if tuple(tensors[name].shape) != shape:
            raise WeightsError(
                f"{path}: tensor {name!r} has shape {list(tensors[name].shape)}, "
                f"expected {list(shape)}"
            )
