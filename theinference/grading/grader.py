"""One grading run: stages in order, each stage's cases in the policy's order, each result
built once and complete, every step told to a listener.

The oracle's answers are cached per weights file (answers.py); each case is asked and judged
in judging.py; a stage that did not pass is diagnosed once, here (diagnosis/stage.py), so every
output reads the same diagnosis.
"""

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from theinference.curriculum.checks import CHECKS
from theinference.curriculum.stages import Stage
from theinference.diagnosis.stage import Failure, catalogue_match, diagnose_stage, named_alone
from theinference.grading.ahead import Planner, drawn_stages, runs_alone
from theinference.grading.answers import Answers
from theinference.grading.beside import Workers, beside_count, goes_beside, grade_beside
from theinference.grading.environment import describe
from theinference.grading.judging import grade_case, kept_prompts
from theinference.grading.own_cache import (
    asks_own_first,
    grade_own_first,
    wanted_again,
    wanted_first,
)
from theinference.grading.policy import (
    EVERY_CASE,
    LONG_CASE_TOKENS,
    RunPolicy,
    case_size,
    is_long,
)
from theinference.grading.policy import plan as plan_cases
from theinference.grading.prerequisites import first_blocker, skipped, stage_limits
from theinference.grading.swap_first import Deferred, measure_alone, tries_beside, try_beside
from theinference.oracle.weights import Weights
from theinference.results import CaseResult, RunResult, StageResult, Status, stage_status
from theinference.results.events import (
    CaseFinished,
    CaseStarted,
    Listener,
    RunFinished,
    RunStarted,
    StageFinished,
    StageStarted,
    ignore,
    serialized,
)
from theinference.student.setup import Limits, ProcessSetup

FAILING = {Status.FAILED, Status.ERROR, Status.TIMEOUT}


@dataclass(frozen=True)
class RunPlan:
    """What a run grades: the stages, the weights the oracle answers from (the file the
    student's process reads: its ProcessSetup's), its answers kept across runs, which cases
    (the policy) and the seed of the drawn cases (None: afresh for this run)."""

    stages: list[Stage]
    weights: Weights
    answers: Answers | None = None
    policy: RunPolicy = EVERY_CASE
    seed: int | None = None
    jobs: int = 1  # student processes taking a stage's long cases beside each other
    failed_before: frozenset[str] = frozenset()  # stages the course's last run failed
    fresh_seed: bool = False  # `seed` was drawn for this run alone (a watch's next run's)


def grade(setup: ProcessSetup, plan: RunPlan, listener: Listener = ignore) -> RunResult:
    """Grade the stages in order, telling `listener` as stages and cases start and finish.
    `setup.cancel`, set from another thread, stops the run early; its result is then marked
    cancelled. The result returned (and told in RunFinished) is complete."""
    started = time.monotonic()
    weights, policy, cancel = plan.weights, plan.policy, setup.cancel
    run_seed = plan.seed if plan.seed is not None else secrets.randbits(63)
    stages = drawn_stages(plan.stages, policy, run_seed)
    answers = plan.answers or Answers(weights)
    answers.keeps_draws = plan.seed is not None and not plan.fresh_seed  # kept_prompts
    results: dict[str, StageResult] = {}
    listener(RunStarted(tuple(s.slug for s in stages)))
    listener = serialized(listener)  # long cases beside each other tell it from threads
    with Workers(setup, plan.jobs) as workers:
        for stage in stages:
            if cancel.is_set():
                break
            blocker = first_blocker(stage, results)
            if blocker:
                results[stage.slug] = skipped(stage, blocker)
            else:
                run = StageRun(stage, workers, answers, policy, listener,
                               stage.slug in plan.failed_before)
                results[stage.slug] = run.grade(stage_limits(stage, setup.limits))
            listener(StageFinished(results[stage.slug]))
        process = workers.first
        startups = sum(p.startups for p in workers.processes)
        startup_seconds = sum(p.startup_seconds for p in workers.processes)
        kind, notes, cpu_account = process.sandbox, process.notes, process.cpu_account
    result = RunResult(
        stages=list(results.values()),
        weights_label=weights.label,
        weights_sha256=weights.sha256,
        seconds=time.monotonic() - started,
        worker_startups=startups,
        worker_startup_seconds=startup_seconds,
        cancelled=cancel.is_set(),
        environment=describe(),
        notes=[*notes, *answers.notes],
        sandbox=kind,
        cpu_account=cpu_account,
    )
    listener(RunFinished(result))
    return result


class StageRun:
    """One stage's cases, smallest first, until the policy says stop."""

    def __init__(self, stage, workers: Workers, answers, policy, listener,
                 failed_before: bool = False):
        self.stage, self.workers, self.answers = stage, workers, answers
        self.process, self.policy, self.listener = workers.first, policy, listener
        self.cancel = self.process.cancel  # the run's: set from another thread
        self.language = self.process.language.name  # the diagnosis speaks it
        self.lock = threading.Lock()  # the stage's failures, told from threads
        # a case of the stage has shown a decode that ignores its swapped cache: a later
        # measured call keeps its CPU limit after its swap (it would recompute to the end)
        self.recomputes = False
        self.failed = 0  # the stage's failed cases so far, numbers or not (generate's tokens)
        # the last case recorded failed over its own cache; at the start, the stage failed
        # in the course's last run (own_cache.wanted_first)
        self.last_failed_own = failed_before

    def grade(self, limits: Limits) -> StageResult:
        started = time.monotonic()
        self.limits = limits
        self.workers.started()  # a process is never given limits while it starts
        self.process.use_limits(limits)
        cases = plan_cases(self.stage, self.policy)
        if not cases.cases:  # a run of nothing must never pass
            result = skipped(self.stage, "the run's case filter selects none of its cases")
            return replace(result, partial=True, not_run=list(cases.left_out))
        self.planner = Planner(cases.cases, self.answers, threading.Event())
        config = self.answers.recompute.config
        self.answers.bases = kept_prompts(self.stage, config, self.answers.keeps_draws)
        self.listener(StageStarted(self.stage.slug, self.stage.title, len(cases.cases)))
        if not runs_alone(cases.cases[0], config):  # else its own
            self.workers.start_first(limits)  # while the planner makes the first case's plan
        self.planner.start()
        try:
            results, failures = self.run_cases(cases.cases)
        finally:  # its plans are this stage's; the next stage's planner waits for it
            self.planner.close()
        stopped = [c.name for c in cases.cases[len(results) :]]
        if self.cancel.is_set():  # a stale run: its diagnosis would never be read
            failures = []
        found = diagnose_stage(results, failures, self.stage.tolerance, self.answers.recompute,
                               self.language, self.answers.cache.get_or_compute)
        status = stage_status(results)
        # a stage that stopped at its first case, todo, has not started: not a partial verdict
        todo_stop = status == Status.TODO and len(results) == 1 and not self.cancel.is_set()
        return StageResult(
            self.stage.slug,
            self.stage.title,
            status,
            results,
            seconds=time.monotonic() - started,
            score_weight=self.stage.score,
            partial=bool(cases.left_out) or (bool(stopped) and not todo_stop),
            not_run=list(cases.left_out) + stopped,
            **asdict(found),
        )

    def run_cases(self, cases) -> tuple[list[CaseResult], list[Failure]]:
        """The cases in order, the long ones in a row beside each other (beside.py); the
        results in the cases' order, with the failing answers the diagnosis reads."""
        results: list[CaseResult] = []
        failures: list[Failure] = []
        index = 0
        while index < len(cases) and not self.cancel.is_set():
            batch = list(cases[index : index + max(self.beside_from(cases, index), 1)])
            processes = self.workers.at_most(len(batch), self.limits)
            done = grade_beside(batch, processes,
                                lambda case, p: self.one_case(case, cases, p, failures),
                                self.cancel, self.workers.wait_for)
            done = [self.alone(d, failures) if isinstance(d, Deferred) else d for d in done]
            results += [r for r in done if r is not None]
            index += len(batch)
            following = cases[index] if index < len(cases) else None
            if self.stops_after(results, len(failures), following):
                break
            if len(results) == 1:  # the stage has begun (its first case is not todo)
                self.start_beside(cases, index)
        return results, failures

    def beside_from(self, cases, index: int) -> int:
        return beside_count(list(cases), index, self.answers.recompute.config,
                            self.workers.jobs, self.policy.stop_at_first_failure)

    def start_beside(self, cases, index: int) -> None:
        """The processes that will take the stage's cases beside the first, started now,
        while the first takes the small cases (each start-up cost the stage a tenth of a
        second or more when paid as its long cases began)."""
        longs = sum(goes_beside(case, self.answers.recompute.config) for case in cases[index:])
        count = max(longs, self.beside_from(cases, index))
        if self.workers.jobs > 1 and count > 1:
            self.workers.start_ahead(count, self.limits)

    def one_case(self, case, cases, process, failures: list[Failure]) -> CaseResult:
        self.listener(CaseStarted(self.stage.slug, case.name, cases.index(case), len(cases)))
        ask_again = self.ask_again(case, failures)
        if runs_alone(case, self.answers.recompute.config) or case_size(case) > LONG_CASE_TOKENS:
            # its CPU is measured, or it is long (its wall time nears the timeout on a busy
            # machine): the processes started ahead have started and the earlier cases'
            # plans are made by then (a later plan, or its own, is made beside: pending.py)
            self.planner.ready_for(case)
            self.workers.started()
        if not tries_beside(case, self.answers.recompute.config):
            graded = self.ask_own_first(case, process, failures) or grade_case(
                self.stage, case, process, self.answers, ask_again, lift_limit=not self.recomputes
            )
        elif self.recomputes:  # a decode that ignores its swap: measured, its limit kept
            return Deferred(case, floor_only=False)
        else:
            graded = try_beside(self.stage, case, process, self.answers, ask_again)
        if isinstance(graded, Deferred):
            return graded  # measured alone, after the cases beside it (self.alone)
        return self.record(case, graded, failures)

    def ask_again(self, case, failures: list[Failure]) -> Callable[[], bool]:
        """Whether a departing answer of `case` is asked again, asked when it departs: the
        stage's failures are known by then."""

        def asked() -> bool:
            with self.lock:
                failing = max(len(failures), self.failed)
                return wanted_again(case, failing, lambda: self.settled(failures))

        return asked

    def ask_own_first(self, case, process, failures: list[Failure]) -> tuple | None:
        """The case graded over the student's own cache first, where own_cache.py says so;
        else None."""
        if not asks_own_first(CHECKS[case.check], case):
            return None
        with self.lock:
            failing = max(len(failures), self.failed)
            first = wanted_first(case, failing, self.last_failed_own,
                                 lambda: self.settled(failures))
        return grade_own_first(self.stage, case, process, self.answers) if first else None

    def alone(self, deferred: Deferred, failures: list[Failure]) -> CaseResult | None:
        """A deferred case measured alone, in a fresh process (swap_first.py); None when the
        run was cancelled meanwhile."""
        if self.cancel.is_set():
            return None
        self.workers.started()
        graded = measure_alone(deferred, self.stage, self.process, self.answers,
                               self.ask_again(deferred.case, failures), not self.recomputes)
        return self.record(deferred.case, graded, failures)

    def record(self, case, graded: tuple, failures: list[Failure]) -> CaseResult:
        """A case's result, its failing answer kept for the diagnosis, told to the listener."""
        result, args, verdict = graded
        with self.lock:
            if verdict.actual is not None:
                failures.append(Failure(case.check, args, verdict.actual))
            self.recomputes |= verdict.suspected_bug == "decode-recomputes"
            self.failed += verdict.status == Status.FAILED
            self.last_failed_own = verdict.actual is not None
        self.listener(CaseFinished(self.stage.slug, result))
        return result

    def settled(self, failures: list[Failure]) -> bool:
        """The catalogue names one bug on the failing answers so far (the same match the
        stage's diagnosis makes at its end, its variants kept in the answer cache)."""
        found = catalogue_match(failures, self.stage.tolerance, self.answers.recompute,
                                self.answers.cache.get_or_compute)
        return named_alone(found)

    def stops_after(self, results: list[CaseResult], numeric: int, following) -> bool:
        """A first case that is todo: the stage is not started, the rest would say the same.
        In watch mode, a failure ends the stage, except that after a first numeric failure
        the small cases go on until a second one: a bug is named only when a second failing
        case confirms it (fingerprints.MIN_CASES), and two bugs can agree on the smallest."""
        last = results[-1]
        if len(results) == 1 and last.status == Status.TODO:
            return True
        failing = [r for r in results if r.status in FAILING]
        if not self.policy.stop_at_first_failure or not failing:
            return False
        only_numbers = all(r.status == Status.FAILED for r in failing)
        confirming = only_numbers and numeric == 1
        return not confirming or following is None or is_long(following)
