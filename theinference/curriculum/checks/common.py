"""What every check shares: the verdict it gives, how it is declared, and its stage's words.

A check is declared where it is defined, in the module named after its stage
(checks/build_prefill.py for build-prefill), by decorating its judge:

    @check("prefill_logits", adapter="run_prefill", arguments=..., expect=...)
    def prefill_logits(value, args, ask, tol, config) -> Verdict:
        '''The last prompt position's logits equal the recompute's.'''

The docstring is what the student reads about the check; the words it says (hints, messages)
come from the stage's TOML through `say`.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theinference.curriculum.stages import Case, stage_words
from theinference.oracle.cached_path import Simulate
from theinference.oracle.config import ModelConfig
from theinference.results import Finding
from theinference.results.compare import Tolerance


@dataclass
class Verdict(Finding):
    """A check's finding, with the student's numbers when they failed the comparison (kept
    only while the stage is diagnosed: a case's result carries the finding alone)."""

    actual: np.ndarray | None = None


class Rejected(Exception):
    """The returned value cannot be compared at all (wrong type, shape, NaN)."""


Ask = Callable[[list], object]  # the recompute's answer for some arguments (cached)
Judge = Callable[[object, list, Ask, Tolerance, ModelConfig], Verdict]


@dataclass(frozen=True)
class Check:
    """`arguments` turns a case into the adapter's arguments; `expect` is the recompute's
    answer to a question; `judge` validates the student's value and asks what it needs
    (usually the case's own arguments; generate-loop asks about the student's own tokens).
    Cache-use proofs: `hook` names the student's function every call of the stage wraps (so a
    probe looks like any other call until that function returns); `swap` plans the swapped
    cache a case asks about (checks/swap.py); `flop` counts the floating-point work a
    recompute of the case needs (checks/floor.py). A judge with either gets (value, what was
    measured or seen). `simulate` runs the case along the cached path
    (oracle/cached_path.py), for the noise floor and, with a bug's variant, for the
    fingerprints."""

    name: str
    stage: str  # the slug of the stage whose module declares it
    # the inputs that size a case: the tokens they hand the student's code, or a count of new
    # tokens asked for (grading/policy.py runs cases smallest first and calls the big ones long)
    sized_by: tuple[str, ...]
    description: str  # the judge's docstring: what the student reads about this check
    adapter: str
    arguments: Callable[[Case, ModelConfig], list]
    expect: Callable[..., object]  # (Recompute, args) -> the answer
    judge: Judge
    simulate: Simulate | None = None
    hook: str | None = None
    watch: str | None = None  # "returns": the hook is any return after the prefill (probes.py)
    # (Recompute, args, seed, state) -> SwapPlan; state: the prompt's K/V, kept (swap.py)
    swap: Callable[..., object] | None = None
    # args -> the prompt rows a watch of returns swaps: its first moment is answered from
    # them while the plan is still being made (grading/pending.py)
    swap_rows: Callable[[list], int] | None = None
    # args -> the prompt whose K/V a fixed case's swap starts from: the grader keeps them
    # across runs (grading/answers.py), so that a run draws the swap alone
    kept_prompt: Callable[[list], list[int]] = lambda args: args[0]  # noqa: E731
    flop: Callable[[list, ModelConfig], float] | None = None
    # the least work a cache needs for the case: a graded case is measured when a recompute
    # needs many times that (floor.worth_measuring); None: always measured (a cost proof)
    cached_flop: Callable[[list, ModelConfig], float] | None = None
    asks_own_arguments: bool = True  # its expected value can be fixed before the call


CHECKS: dict[str, Check] = {}


def stage_of(module: str) -> str:
    """theinference.curriculum.checks.build_prefill -> build-prefill"""
    return module.rsplit(".", 1)[-1].replace("_", "-")


def check(name: str, *, sized_by, adapter: str, arguments, expect, **optional):
    """Register the decorated judge as check `name` of its module's stage (`optional`:
    simulate, hook, watch, swap, swap_rows, kept_prompt, flop, cached_flop, asks_own_arguments,
    as Check says)."""

    def register(judge: Judge) -> Judge:
        if name in CHECKS:
            raise ValueError(f"check {name} is declared twice")
        CHECKS[name] = Check(
            name=name,
            stage=stage_of(judge.__module__),
            sized_by=sized_by,
            description=inspect.getdoc(judge) or "",
            adapter=adapter,
            arguments=arguments,
            expect=expect,
            judge=judge,
            **optional,
        )
        return judge

    return register


class Words:
    """A stage's words from its TOML, read when first spoken: `say("handoff")`, or with the
    figures a message needs, `say("recomputes", seconds=25.3, ratio=21)`."""

    def __init__(self, module: str):
        self.stage = stage_of(module)
        self._words: dict[str, str] | None = None

    def __call__(self, key: str, **figures) -> str:
        if self._words is None:
            self._words = stage_words(self.stage)
        text = self._words[key]
        return text.format(**figures) if figures else text

    def number(self, key: str) -> float:
        return float(self(key))
