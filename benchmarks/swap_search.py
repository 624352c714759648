"""How long the swap of a cache's K/V takes, per layout, for a prompt of the context's length:
the student's process's part (student/worker/swap.py: the walk, the copy of what it holds sent to
the grader, the writes) and the grader's (curriculum/checks/swap_search.py: the search), the time
a swapped decode case adds to the student's call.

    python benchmarks/swap_search.py [--tokens 1023] [--repeats 3]

Each layout holds the oracle's own K/V of one random prompt; the figures are the best of the
repeats, in seconds of CPU, of one swap (both sides in this process, the grader's timed apart):
the student's process's part, the grader's at the moment (what the student's process waits
on), and the search's index, built ahead as the planner builds it (grading/ahead.py)."""

import argparse
import time
from pathlib import Path

import numpy as np

from theinference.curriculum.checks.swap import after_prefill
from theinference.curriculum.checks.swap_search import Search
from theinference.oracle.recompute import Recompute
from theinference.oracle.weights import load_weights
from theinference.student.reply_arrays import Blobs, held_arrays
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
    print(f"{options.tokens}-token cache, best of {options.repeats}, CPU seconds "
          "(the student's process, the grader at the moment, the grader ahead):")
    for name in layouts(plan.finds[:1], options.tokens):
        best = (float("inf"), float("inf"), float("inf"))
        for _ in range(options.repeats):
            holder = layouts(plan.finds, options.tokens)[name]  # fresh: a swap rewrites it
            plan.offered, plan.sent = False, False
            started = time.process_time()
            plan.search = Search(plan.finds, plan.writes)  # as the planner builds it, ahead
            plan.search.prepare()
            ahead = time.process_time() - started
            answer, _ = plan.answer({"call": 1})
            graders = []

            def exchange(word, blobs=(), graders=graders):
                started = time.process_time()
                held = held_arrays(word["probe"]["held"], Blobs(blobs))
                out = plan.answer({**word["probe"], "held": held})
                graders.append(time.process_time() - started)
                return out

            started = time.process_time()
            done = swap.Target(answer["swap"], exchange).swap([holder], None)
            whole = time.process_time() - started
            best = (min(best[0], whole - sum(graders)), min(best[1], sum(graders)),
                    min(best[2], ahead))
            assert done["applied"], done["reason"]
        print(f"  {best[0]:6.2f} {best[1]:6.2f} {best[2]:6.2f}  {name}")


if __name__ == "__main__":
    main()
