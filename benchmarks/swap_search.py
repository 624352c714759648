"""How long the worker's search for a cache's K/V takes (student/worker/swap.py), per layout, for
a prompt of the context's length: the time a swapped decode case adds to the student's call.

    python benchmarks/swap_search.py [--tokens 1023] [--repeats 3]

Each layout holds the oracle's own K/V of one random prompt; the figure is the best of the
repeats, in seconds of CPU, of one swap_cache call (the search and the writes)."""

import argparse
import time
from pathlib import Path

import numpy as np

from theinference.curriculum.checks.swap import after_prefill
from theinference.oracle.recompute import Recompute
from theinference.oracle.weights import load_weights
from theinference.student.worker import swap


def layouts(finds, n: int) -> dict:
    """The same K/V kept the ways the tests' solutions keep them."""
    merged = [np.concatenate([f.k, f.v], axis=0).transpose(1, 0, 2).reshape(n, -1) for f in finds]
    pool = np.zeros((len(finds), 2, 12, 1024, 64), dtype=np.float32)  # preallocated
    for layer, f in enumerate(finds):
        pool[layer, 0, :, :n], pool[layer, 1, :, :n] = f.k, f.v
    return {
        "one array per layer, [12, n, 64]": [{"k": f.k.copy(), "v": f.v.copy()} for f in finds],
        "fused K|V per layer, [n, 1536]": merged,
        "one preallocated buffer, [12, 2, 12, 1024, 64]": pool,
        "float16 arrays": [[f.k.astype(np.float16), f.v.astype(np.float16)] for f in finds],
        "one [2, 768] array per token": [
            [np.stack([f.k[:, p].reshape(-1), f.v[:, p].reshape(-1)]) for p in range(n)]
            for f in finds
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1023)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    weights = load_weights("synthetic", Path("."))
    recompute = Recompute(weights.tensors, weights.config)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 50257, options.tokens)]
    plan = after_prefill(recompute, prompt, [0], seed=1)
    answer, blobs = plan.answer({"call": 1})
    print(f"{options.tokens}-token cache, best of {options.repeats}, CPU seconds:")
    for name in layouts(plan.finds[:1], options.tokens):
        best = float("inf")
        for _ in range(options.repeats):
            holder = layouts(plan.finds, options.tokens)[name]  # fresh: a swap rewrites it
            started = time.process_time()
            done = swap.swap_cache([holder], None, answer["swap"], blobs)
            best = min(best, time.process_time() - started)
            assert done["applied"], done["reason"]
        print(f"  {best:6.2f}  {name}")


if __name__ == "__main__":
    main()
