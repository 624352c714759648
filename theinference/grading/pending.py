"""A swapped call's plan still being made as its call begins.

A stage's plans are made in a thread from its start (ahead.Planner); a call whose cache is
swapped after its prefill and whose plan is not made yet does not wait for it (a measured
call only where its floor has room: below). Its watch of returns asks at its first moment, at once
(the adapter's own helpers return first), and is told the swap's sizes, which the arguments
fix (Check.swap_rows); only a word about what the process holds, after the prompt's prefill,
needs the plan itself, and waits for it there. The student's prefill of a long prompt takes
about as long as the oracle's forward over it, so the two overlap rather than follow each
other (a stage's first case: the oracle's first plan reads the weights, a third of a second,
while the student's process answers). Nothing about the proof changes: the plan is the one the
call would have waited for. A measured call only where the floor's limit holds many prefills of
the prompt (measured.room_beside): the oracle's thread may slow the student's prefill a little,
which a floor with little room could see.
"""

from collections.abc import Callable

from theinference.curriculum.checks.swap import PATIENCE, SwapPlan, offered
from theinference.oracle.config import HEAD_DIM, ModelConfig

NOT_DRAWN = "no swap could be drawn for this call: its cost is the evidence"


class PendingPlan:
    """The plan of a call's watch of returns (offered at its first moment; `patience`: the
    plan's, swap.PATIENCE where a floor is the fallback, else None), as the call sees it before
    it is made: `wait()` gives (the plan or None, the oracle's seconds making it) once it is."""

    def __init__(self, wait: Callable[[], tuple | None], config: ModelConfig, rows: int,
                 patience: int | None = PATIENCE):
        self.wait = wait
        self.sizes = (config.n_layer, config.n_head, HEAD_DIM, rows)
        self.patience = patience
        self.calls, self.offered = 0, False
        self.made: tuple | None = None

    def resolve(self) -> tuple:
        """(the plan or None, seconds), waiting while it is being made; what the call was
        told before then is the plan's from now on (its `not_applied` reads it)."""
        if self.made is None:
            self.made = self.wait() or (None, 0.0)
            plan = self.made[0]
            if plan is not None:
                plan.calls, plan.offered = max(plan.calls, self.calls), self.offered
        return self.made

    @property
    def sent(self) -> bool:
        """The writes went out (what lifts the call's CPU limit): the plan's own fact."""
        return self.made is not None and self.made[0] is not None and self.made[0].sent

    def answer(self, word: dict) -> tuple[dict, list[bytes]]:
        """SwapPlan.answer, its first moment answered from the sizes alone."""
        if "held" not in word and self.made is None:
            call = word.get("call")
            self.calls = max(self.calls, call if isinstance(call, int) else self.calls + 1)
            if self.offered:
                return {"swap": None, "next": None}, []
            self.offered = True
            return {"swap": offered(*self.sizes, self.patience), "next": None}, []
        plan: SwapPlan | None = self.resolve()[0]
        if plan is None:
            return {"write": None, "reason": NOT_DRAWN, "stop": True}, []
        return plan.answer(word)

