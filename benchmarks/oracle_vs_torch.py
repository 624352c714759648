"""The grader's NumPy oracle against Hugging Face transformers' GPT-2 (PyTorch eager, CPU),
same weights, same thread count, side by side in one run; and against this machine's sgemm.

    pip install torch==2.13.0 transformers threadpoolctl
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/oracle_vs_torch.py

(Some machines here set OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE, which slow a current NumPy:
unset them for this command only, never in tests or CI. The kernel that ran is printed.)

Both sides compute the last position's logits for a prompt of n tokens: what a grading case
asks for. transformers computes logits for every position; its figure for the same work
(transformer, then lm_head on the last row) is printed too.
"""

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import hf_gpt2  # noqa: E402
from theinference.curriculum.stages import token_ids  # noqa: E402
from theinference.oracle import gpt2 as oracle
from theinference.oracle.weights import load_weights  # noqa: E402

THREADS = 2
LENGTHS = (16, 128, 512)
REPEATS = 7


def main() -> None:
    import torch
    import transformers

    torch.set_num_threads(THREADS)
    print_kernels()
    weights = load_weights("synthetic", Path("."))
    model = hf_gpt2(weights, torch, transformers)
    print(
        f"{'tokens':>6} {'oracle ms':>10} {'torch ms':>9} {'ratio':>6} "
        f"{'torch same-work ms':>19} {'ratio':>6}"
    )
    for n in LENGTHS:
        print(row(n, weights, model, torch))
    sgemm_limit(weights.tensors, weights.config.n_layer, weights.config.n_embd)


def row(n: int, weights, model, torch) -> str:
    w, n_layer = weights.tensors, weights.config.n_layer
    ids = token_ids({"random": n, "seed": 1}, weights.config)
    ours = timed(lambda: oracle.logits_at(oracle.forward(ids, w, n_layer, True).hidden, w, [0]))
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        full = timed(lambda: model(tensor).logits[0, -1])
        same = timed(lambda: model.lm_head(model.transformer(tensor)[0][0, -1]))
    return (
        f"{n:>6} {ours:>10.1f} {full:>9.1f} {ours / full:>6.2f} {same:>19.1f} {ours / same:>6.2f}"
    )


def timed(fn) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        fn()
        samples.append(1000 * (time.perf_counter() - started))
    return statistics.median(samples)


def sgemm_limit(w: dict, n_layer: int, d: int) -> None:
    """The oracle at 512 tokens against the FLOPs it must do at this machine's sgemm rate."""
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    rate = 2 * 2048**3 / (timed(lambda: a @ a) / 1000)  # FLOP/s
    n = 512
    per_layer = 2 * n * d * (3 * d + d + 8 * d) + 2 * 2 * n * n * d  # projections + attention
    flops = n_layer * per_layer + 2 * d * w["wte.weight"].shape[0]
    ideal_ms = 1000 * flops / rate
    ids = list(range(n))
    ours = timed(lambda: oracle.logits_at(oracle.forward(ids, w, n_layer, True).hidden, w, [0]))
    print(
        f"\nsgemm {rate / 1e9:.0f} GFLOP/s; 512 tokens = {flops / 1e9:.0f} GFLOP, "
        f"{ideal_ms:.0f} ms at that rate; oracle {ours:.0f} ms = {ours / ideal_ms:.2f}x it"
    )


def print_kernels() -> None:
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            print(
                f"{pool['internal_api']}: {pool.get('architecture')}, "
                f"{pool['num_threads']} threads ({pool['filepath'].split('/')[-1]})"
            )
    except ImportError:
        print("(threadpoolctl not installed: kernel not shown)")


if __name__ == "__main__":
    main()
