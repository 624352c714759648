"""`theinference bench`: how much the student's cache buys them, measured on their own code.

Per prompt length L, through the contract's adapters only:
- recompute, per token: the student's prefill of L tokens (one full forward: what a
  cache-less generator pays for every new token at that length);
- cached, per token: (T(generate N) - T(generate 1)) / (N - 1), the decode steps alone;
- the oracle's cached decode per token at the same length, for scale.
Each figure is the median of several timed runs after a warm-up, with its spread.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from theinference.curriculum.stages import token_ids
from theinference.oracle import gpt2 as oracle
from theinference.oracle.weights import Weights
from theinference.student.process import StudentProcess
from theinference.student.setup import ProcessSetup


class BenchError(Exception):
    """The student's code could not be timed; the message says which call failed."""


@dataclass
class Timing:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, samples: list[float]) -> "Timing":
        return cls(statistics.median(samples), min(samples), max(samples))


@dataclass
class BenchRow:
    length: int
    recompute_ms: Timing  # per token
    cached_ms: Timing  # per token
    oracle_cached_ms: float  # per token

    @property
    def speedup(self) -> float:
        # 0 when the decode time drowned in timing noise (clamped to 0): no figure to give
        if self.cached_ms.median <= 0:
            return 0.0
        return self.recompute_ms.median / self.cached_ms.median

    @property
    def versus_oracle(self) -> float:
        return self.cached_ms.median / max(self.oracle_cached_ms, 1e-9)


@dataclass
class BenchResult:
    rows: list[BenchRow] = field(default_factory=list)
    new_tokens: int = 0
    repeats: int = 0
    weights_label: str = ""


@dataclass(frozen=True)
class BenchPlan:
    lengths: list[int]  # prompt lengths
    new_tokens: int
    repeats: int


def bench(
    setup: ProcessSetup,
    weights: Weights,
    plan: BenchPlan,
    progress: Callable[[str, str, int, int], None] = lambda *shown: None,
) -> BenchResult:
    lengths, new_tokens, repeats = plan.lengths, plan.new_tokens, plan.repeats
    result = BenchResult(new_tokens=new_tokens, repeats=repeats, weights_label=weights.label)
    with StudentProcess(setup) as worker:
        for done, length in enumerate(lengths):
            progress("bench", f"{length}-token prompt", done, len(lengths))
            prompt = token_ids({"random": length, "seed": 99}, weights.config)
            recompute = timed(worker, "run_prefill", [prompt], repeats)
            one = timed(worker, "run_generate", [prompt, 1], repeats)
            many = timed(worker, "run_generate", [prompt, new_tokens], repeats)
            per_token = [max(m - o, 0.0) / (new_tokens - 1) for m, o in zip(many, one, strict=True)]
            result.rows.append(
                BenchRow(
                    length=length,
                    recompute_ms=Timing.of([1000 * s for s in recompute]),
                    cached_ms=Timing.of([1000 * s for s in per_token]),
                    oracle_cached_ms=1000 * oracle_decode_seconds(prompt, new_tokens, weights),
                )
            )
    return result


def timed(worker: StudentProcess, adapter: str, args: list, repeats: int) -> list[float]:
    """Seconds per call, after one untimed warm-up call."""
    samples = []
    for i in range(repeats + 1):
        outcome = worker.call(adapter, args)
        if outcome.kind != "returned":
            raise BenchError(
                f"{adapter} did not return ({outcome.kind}): {outcome.message}\n(bench needs "
                "run_prefill and run_generate working: theinference test -s generate-loop)"
            )
        if i:
            samples.append(outcome.seconds)
    return samples


def oracle_decode_seconds(prompt: list[int], steps: int, weights: Weights) -> float:
    """The oracle's own cached decode, seconds per token at this length."""
    w, n_layer = weights.tensors, weights.config.n_layer
    prefilled = oracle.forward(prompt, w, n_layer)
    started = time.perf_counter()
    oracle.greedy(prefilled, steps, w, n_layer)
    return (time.perf_counter() - started) / steps


def to_json(result: BenchResult) -> dict:
    return {
        "schema": "theinference.grading.bench/1",
        "weights": result.weights_label,
        "new_tokens": result.new_tokens,
        "repeats": result.repeats,
        "rows": [
            {
                "prompt_length": r.length,
                "recompute_ms_per_token": vars(r.recompute_ms),
                "cached_ms_per_token": vars(r.cached_ms),
                "speedup": r.speedup,
                "oracle_cached_ms_per_token": r.oracle_cached_ms,
                "cached_vs_oracle": r.versus_oracle,
            }
            for r in result.rows
        ],
    }
