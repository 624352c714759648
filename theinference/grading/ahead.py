"""The oracle's swap plans for a watched course's next run, made while the student edits.

Every swapped-cache proof is drawn per run (the run's seed picks its arguments and its swap),
so its answer is never in the answer cache: each run's oracle makes it, a decode over the
prompt's kept K/V per swapped case. In watch mode the grader is idle between a run's end and
the next save, so it draws the next run's seed then and makes that run's plans; the run, on
the save, finds them made. The seed stays the grader's alone, fresh for every run, and the
plans are the same as the run would make (the same function, arguments and seed): nothing
about the proofs changes, only when the oracle works. It works while no run is going (the
loop stops it before a run starts), so it never runs beside the student's code.
"""

import threading

from theinference.curriculum.checks import CHECKS
from theinference.curriculum.stages import Stage, with_run_draws
from theinference.grading.answers import Answers
from theinference.grading.judging import kept_prompts
from theinference.grading.policy import RunPolicy, quick_draws
from theinference.grading.policy import plan as plan_cases


def drawn_stages(stages: list[Stage], policy: RunPolicy, seed: int) -> list[Stage]:
    """The stages as a run with this seed grades them (grader.grade draws them so too)."""
    stages = [quick_draws(s) for s in stages] if policy.quick else list(stages)
    return [with_run_draws(stage, seed) for stage in stages]


def plan_ahead(stages: list[Stage], answers: Answers, policy: RunPolicy, seed: int,
               stop: threading.Event) -> int:
    """Make the swap plans of a run of `stages` with `seed` and `policy`, in running order
    (the smallest case first: the first verdict needs it first), into `answers` (for
    Answers.planned), until `stop` is set. Plans made for an earlier seed are dropped first.
    Returns how many were made."""
    answers.ahead.clear()
    config, made = answers.recompute.config, 0
    for stage in drawn_stages(stages, policy, seed):
        answers.bases = kept_prompts(stage, config)
        for case in plan_cases(stage, policy).cases:
            check = CHECKS[case.check]
            if check.swap is None:
                continue
            if stop.is_set():
                return made
            args, swap_seed = check.arguments(case, config), int(case.inputs.get("swap", 0))
            plan = check.swap(answers.recompute, args, swap_seed, answers.prompt_state)
            answers.keep_plan(case.check, args, swap_seed, plan)
            made += 1
    return made
