"""The oracle's answers for one weights file: from the answer cache, else recomputed.

The grader asks here for every expected value and every float32 noise floor; the cache
(answer_cache.py) keeps them in memory for a watch session and on disk across processes.
"""

import threading
from dataclasses import replace

import numpy as np

from theinference.curriculum.checks import CHECKS, swap
from theinference.grading.answer_cache import AnswerCache
from theinference.oracle import gpt2 as oracle
from theinference.oracle.cached_path import CachedPath
from theinference.oracle.gpt2 import LayerKV
from theinference.oracle.recompute import Recompute
from theinference.oracle.weights import Weights


class Answers:
    """The oracle's answers for one weights file, cached."""

    def __init__(self, weights: Weights, cache: AnswerCache | None = None):
        self.recompute = Recompute(weights.tensors, weights.config)
        self.cache = cache or AnswerCache(weights.sha256, None)
        self.bases: list[list[int]] = []  # prompts whose K/V are kept (prompt_state)
        # the run's seed was given, so the prompts it draws are drawn again (kept_prompts)
        self.keeps_draws = False
        self.ahead: dict = {}  # swap plans made before their case (ahead.py), used once
        self.making: dict = {}  # the plans being made ahead: set when made or given up
        self.wanted: list = []  # keys of plans a begun call waits or will wait for, in order
        self.wanting = threading.Lock()  # `wanted` is changed from the calls' threads
        self.last_planner = None  # the last stage's (ahead.Planner), maybe still stopping

    @classmethod
    def cached(cls, weights: Weights) -> "Answers":
        """Answers kept on disk too, in the grader's cache directory, across runs."""
        from theinference.oracle.weights import cache_dir

        return cls(weights, AnswerCache(weights.sha256, cache_dir()))

    @classmethod
    def in_memory(cls, weights: Weights) -> "Answers":
        """Answers for a run whose student process runs as the grader's own user: nothing read
        from or written to the disk cache, which that process could forge."""
        answers = cls(weights)
        answers.cache.notes.append(
            "the oracle's answers were kept in memory only: the student's process ran as your "
            "own user and could have written the answer cache"
        )
        return answers

    @property
    def notes(self) -> list[str]:
        """What the run should know about the answers (e.g. the cache switched off)."""
        return list(self.cache.notes)

    def expected(self, check_name: str, args: list):
        def compute():
            return CHECKS[check_name].expect(self.recompute, args)

        return self.cache.get_or_compute(check_name, args, compute)

    def prompt_state(self, recompute: Recompute, prompt: list[int], new_ids: list[int]):
        """swap.prompt_state, from K/V kept across runs: the prompt's K/V are the first rows of
        a kept prompt it begins (`bases`, the stage's fixed prompts: a causal forward's first
        rows depend on the first tokens alone), else its own, not kept; the unswapped logits, one
        decode of `new_ids` over them, kept too. A swap drawn per run then costs the oracle a few
        decodes, not a forward over the prompt."""
        base = next((b for b in self.bases if b[: len(prompt)] == prompt), None)
        if base is None:  # drawn afresh for this run (a hidden case, a cost proof): not kept
            return swap.prompt_state(recompute, prompt, new_ids)
        kv = self.cache.get_or_compute("swap:prompt-kv", [base], lambda: recompute.kv_of(base))
        finds = [LayerKV(k=layer.k[:, : len(prompt)], v=layer.v[:, : len(prompt)]) for layer in kv]

        def unswapped() -> np.ndarray:  # [len(new_ids), vocab]
            if not new_ids:  # the K/V alone were asked for
                return np.zeros((0, recompute.config.vocab_size), np.float32)
            decoded = oracle.extend(new_ids, recompute.w, recompute.config.n_layer, finds)
            return oracle.logits_at(decoded.hidden, recompute.w, list(range(len(new_ids))))

        return finds, self.cache.get_or_compute("swap:unswapped", [prompt, new_ids], unswapped)

    def keep_plan(self, check_name: str, args: list, seed: int, made: tuple) -> None:
        """A swap plan made before its case (ahead.py), with the seconds it took, for
        `planned` to hand out once."""
        key = plan_key(check_name, args, seed)
        self.ahead[key] = made
        self.making.pop(key, threading.Event()).set()
        self.unwant(key)

    def expect_plan(self, check_name: str, args: list, seed: int) -> tuple | None:
        """A plan to be made ahead by the caller, unless it is made or being made already:
        `planned` waits for it rather than make it twice. Its key, if the caller is to make
        it (for `expect_none`), else None."""
        key = plan_key(check_name, args, seed)
        if key in self.ahead or key in self.making:
            return None
        self.making[key] = threading.Event()
        return key

    def expect_none(self, keys: list[tuple]) -> None:
        """These plans are not being made (any more): no one waits for them."""
        for key in keys:
            made = self.making.pop(key, None)
            if made is not None:
                made.set()
            self.unwant(key)

    def being_made(self, check_name: str, args: list, seed: int) -> bool:
        """Whether this case's plan is being made ahead, or waits its turn to be."""
        return plan_key(check_name, args, seed) in self.making

    def want(self, check_name: str, args: list, seed: int) -> None:
        """A call has begun that needs this plan: the planner makes it next (ahead.Planner)."""
        with self.wanting:
            self.wanted.append(plan_key(check_name, args, seed))

    def unwant(self, key: tuple) -> None:
        """Its plan is made, or will not be: no longer wanted (asked twice, by a call and by
        its wait, it is in the list twice)."""
        with self.wanting:
            self.wanted[:] = [k for k in self.wanted if k != key]

    def wanted_now(self) -> list:
        with self.wanting:
            return list(self.wanted)

    def planned(self, check_name: str, args: list, seed: int):
        """(the swap plan made ahead for this case, as fresh as one just made: no hook heard
        yet; the oracle's seconds making it), once, waiting while it is being made (made
        next: `want`); None when none was made."""
        key = plan_key(check_name, args, seed)
        making = self.making.get(key)
        if making is not None:
            with self.wanting:
                self.wanted.append(key)
            making.wait()
        self.unwant(key)
        made = self.ahead.pop(key, None)
        if made is None or made[0] is None:  # none made, or none drawn (generate_loop.py)
            return made
        return replace(made[0], calls=0, offered=False), made[1]

    def noise(self, check_name: str, args: list) -> float | None:
        """max |the recompute - GPT-2 itself along the cached path|: the float32 drift a
        correct solution shows for this case (0 where the cached path is the recompute, as
        for one token; None where the check runs no cached path)."""
        simulate = CHECKS[check_name].simulate
        if simulate is None:
            return None

        def compute():
            r = self.recompute
            along = CachedPath(r.w, r.config.n_layer).answer(simulate, args)
            if along is None:
                return np.asarray(np.nan)
            return np.asarray(np.abs(self.expected(check_name, args) - along).max(), np.float64)

        drift = float(self.cache.get_or_compute(check_name + ":noise", args, compute))
        return None if np.isnan(drift) else drift


def plan_key(check_name: str, args: list, seed: int) -> tuple:
    """Which case a swap plan made ahead is for: its check, swap seed and arguments."""
    return (check_name, seed, repr(args))
