"""The oracle's swap plans made ahead: a stage's, in a thread while the student's process works
on its earlier cases, and a watched course's next run's, while the student edits.

Every swapped-cache proof is drawn per run (the run's seed picks its arguments and its swap),
so its answer is never in the answer cache: each run's oracle makes it, a decode over the
prompt's kept K/V per swapped case. In watch mode the grader is idle between a run's end and
the next save, so it draws the next run's seed then and makes that run's plans; the run, on
the save, finds them made. The seed stays the grader's alone, fresh for every run, and the
plans are the same as the run would make (the same function, arguments and seed): nothing
about the proofs changes, only when the oracle works. A save stops it between plans; the plan
it is making then is finished beside the new run's first cases (a first verdict never waits
for it) and handed to the run, which waits for it, as for its own Planner, before a
measured or long call.

Within a run, a stage's plans are made in a thread (`Planner`) from the stage's start, in the
cases' order (but a plan a begun call waits for is made next): the first case's at once, the
others while the student's process starts and answers the first ones. The grader's BLAS and the
student's each take one thread (cli.py), so on two cores the two do not spin against each
other. A measured call (a CPU-floor proof) and a long case's call wait until the earlier cases'
plans are made (their calls' answers need them); a later case's plan is made beside it, and a
call swapped after its prefill begins while its own is still in the making (pending.py: the
oracle's forward beside the student's prefill of the same prompt).
"""

import threading
import time

from theinference.curriculum.checks import CHECKS
from theinference.curriculum.checks.swap_search import Search
from theinference.curriculum.stages import Stage, with_run_draws
from theinference.grading.answers import Answers, plan_key
from theinference.grading.environment import blas_is_one_thread
from theinference.grading.judging import is_measured, kept_prompts, swaps
from theinference.grading.policy import RunPolicy, quick_draws
from theinference.grading.policy import plan as plan_cases
from theinference.grading.swap_first import tries_beside
from theinference.oracle.checkpoint import WeightsError


def drawn_stages(stages: list[Stage], policy: RunPolicy, seed: int) -> list[Stage]:
    """The stages as a run with this seed grades them (grader.grade draws them so too)."""
    stages = [quick_draws(s) for s in stages] if policy.quick else list(stages)
    return [with_run_draws(stage, seed) for stage in stages]


def plan_ahead(stages: list[Stage], answers: Answers, policy: RunPolicy, seed: int,
               stop: threading.Event, seed_given: bool = False) -> int:
    """Make the swap plans of a run of `stages` with `seed` and `policy`, in running order
    (the smallest case first: the first verdict needs it first), into `answers` (for
    Answers.planned), until `stop` is set. Plans made for an earlier seed are dropped first.
    `seed_given`: the run's seed is the session's (--seed), not a fresh one (kept_prompts).
    Returns how many were made."""
    answers.ahead.clear()
    config, made = answers.recompute.config, 0
    for stage in drawn_stages(stages, policy, seed):
        # (a run started meanwhile sets its own; a prompt's K/V are right from either)
        answers.bases = kept_prompts(stage, config, drawn=seed_given)
        for _, check, args, swap_seed in swap_plans(plan_cases(stage, policy).cases, config):
            if stop.is_set():
                return made
            key = answers.expect_plan(check.name, args, swap_seed)  # a run may wait for it
            if key is None:  # made, or a run started meanwhile makes it
                continue
            try:
                answers.keep_plan(check.name, args, swap_seed,
                                  timed_plan(check, answers, args, swap_seed))
            finally:
                answers.expect_none([key])
            made += 1
    return made


def swap_plans(cases, config) -> list[tuple]:
    """(case, check, arguments, swap seed) of each case whose call has its cache swapped, in
    order."""
    swapped = [(CHECKS[c.check], c) for c in cases
               if swaps(CHECKS[c.check], c, runs_measured(c, config))]
    return [(c, check, check.arguments(c, config), int(c.inputs.get("swap", 0)))
            for check, c in swapped]


class Between:
    """The plans being made between runs (plan_ahead, in the watch loop's thread), as a run's
    Planner sees them: the run does not wait for the plan being made when it starts, only
    where a Planner waits (before a measured call, before its own plans)."""

    def __init__(self, thread: threading.Thread):
        self.thread = thread

    def done(self) -> None:
        if self.thread is not threading.current_thread():
            self.thread.join()


def runs_measured(case, config) -> bool:
    """Whether the case's call runs against a floor (judging.is_measured)."""
    check = CHECKS[case.check]
    return is_measured(check, case, check.arguments(case, config), config)


def runs_alone(case, config) -> bool:
    """Whether the case's call has its CPU measured (a floor's proof, or a refusal bounded by
    one): nothing of the grader's may share the machine with it. A measured case whose cache
    is swapped is tried beside the others first (swap_first.py): alone only if deferred."""
    if case.inputs.get("must_raise"):
        return True
    return runs_measured(case, config) and not tries_beside(case, config)


class Planner:
    """A stage's swap plans, made in a thread in running order; a case's `fix_answer` takes its
    own (Answers.planned waits for one being made). `close` stops it between plans and waits."""

    def __init__(self, cases, answers: Answers, stop: threading.Event):
        # the last stage's planner, or the plans made between runs, maybe still making one:
        # not waited for here (a first case with no plan need not), but before any plan of
        # this one's and in `done`
        self.before, answers.last_planner = answers.last_planner, None
        self.answers, self.stop = answers, stop
        config = answers.recompute.config
        plans = swap_plans(cases, config)
        self.todo = [(check, args, seed, key) for _, check, args, seed in plans
                     if (key := answers.expect_plan(check.name, args, seed))]  # not made yet
        self.order = [id(case) for case in cases]
        self.keys = [(self.order.index(id(case)), plan_key(check.name, args, seed))
                     for case, check, args, seed in plans]  # (where in the run, its key)
        self.thread = threading.Thread(target=self._make, daemon=True)

    def start(self) -> "Planner":
        if self.todo and blas_is_one_thread():
            self.thread.start()
        else:  # each case makes its own plan: nothing is waited for
            self.answers.expect_none([key for *_, key in self.todo])
        return self

    def _make(self) -> None:
        try:
            self._wait_before()
            left = list(self.todo)
            while left and not self.stop.is_set():
                check, args, seed, _ = left.pop(self.next_of(left))
                self.answers.keep_plan(check.name, args, seed,
                                       timed_plan(check, self.answers, args, seed))
        except WeightsError:
            pass  # weights changed under the run: its case meets the error in the run's thread
        finally:  # whatever is not made, its case makes itself: no one waits for it
            self.answers.expect_none([key for *_, key in self.todo])

    def next_of(self, left: list) -> int:
        """Which plan of those `left` is made next: the first a begun call wants (a long case
        taken beside the small ones needs its plan long before the small ones' are all
        made), else the first in running order."""
        wanted = self.answers.wanted_now()
        firsts = [wanted.index(key) for *_, key in left if key in wanted]
        if not firsts:
            return 0
        first = wanted[min(firsts)]
        return next(i for i, (*_, key) in enumerate(left) if key == first)

    def _wait_before(self) -> None:
        before = self.before
        if before is not None:
            before.done()
            self.before = None  # (no chain of every run's planners in a long watch)

    def ready_for(self, case) -> None:
        """Wait until the plans of the cases before `case` are made: its own is waited for
        where its call needs it (judging.fix_answer; a measured call's, pending.py), and the
        later ones are made while it runs, the oracle on one core, the call on another."""
        self._wait_before()
        at = self.order.index(id(case)) if id(case) in self.order else len(self.order)
        for where, key in self.keys:
            if where < at and (making := self.answers.making.get(key)) is not None:
                making.wait()

    def done(self) -> None:
        """Wait until no plan is being made."""
        self._wait_before()
        if self.thread.is_alive():
            self.thread.join()

    def close(self) -> None:
        """Stop between plans, without waiting: the stage's verdict is not held up by a plan
        it no longer needs; the next planner, or the next plans made ahead, wait for it."""
        self.stop.set()
        self.answers.last_planner = self


def timed_plan(check, answers: Answers, args: list, seed: int) -> tuple:
    """(the case's swap plan, the oracle's seconds making it: the case's oracle time). Its
    search's index of the prompt's K/V is built here too, beside the student's earlier calls,
    not at the moment the student's process waits on the search (a second for 1000 tokens)."""
    started = time.monotonic()
    plan = check.swap(answers.recompute, args, seed, answers.prompt_state)
    if plan is not None and plan.finds:  # (a plan with no K/V has nothing to index)
        plan.search = Search(plan.finds, plan.writes)
        plan.search.prepare()  # now, not at the moment it is needed
    return plan, time.monotonic() - started
