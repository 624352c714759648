"""How a run spends its time: which cases run, in what order, and when a stage stops early.

Cases run smallest first, the size being the number of tokens the case hands the student's
code (sequence, prompt, continuation, every prompt of a batch, plus the new tokens asked
for): a one-token case answers in milliseconds, and a bug shows there as well as anywhere.
Long cases (the whole context) therefore run last; `quick` leaves them out.
"""

from dataclasses import dataclass, replace

from theinference.curriculum.stages import Case, Stage, drawn_per_run

LONG_CASE_TOKENS = 300  # more than this is a long case: last, and left out by --quick


@dataclass(frozen=True)
class RunPolicy:
    stop_at_first_failure: bool = False  # the first failing case ends its stage (watch mode)
    quick: bool = False  # leave out the long cases while iterating (never for machine formats)
    cases: tuple[str, ...] = ()  # only cases whose name contains one of these (--case)


EVERY_CASE = RunPolicy()  # CI and machine formats: every case, in full


@dataclass(frozen=True)
class CaseSelection:
    """A stage's cases in running order, and those the policy leaves out."""

    cases: tuple[Case, ...]
    left_out: tuple[str, ...]


def token_count(spec) -> int:
    """Tokens in a token-sequence spec (see stages.token_ids), without expanding it."""
    if isinstance(spec, dict):
        count = spec.get("random", spec.get("times", 0))
        return sum(count) // 2 if isinstance(count, list) else int(count)  # a range: mid-way
    if isinstance(spec, list):
        return sum(token_count(item) if isinstance(item, dict | list) else 1 for item in spec)
    return 1


def case_size(case: Case) -> int:
    """The tokens a case hands the student's code, new tokens asked for included: the inputs
    its check says size it."""
    from theinference.curriculum.checks import CHECKS

    inputs = case.inputs | case.inputs.get("draw", {})  # a proof not yet drawn: its ranges
    sized_by = CHECKS[case.check].sized_by if case.check in CHECKS else ()
    return sum(input_size(inputs[key]) for key in sized_by if key in inputs)


def input_size(value) -> int:
    """A count (new tokens asked for) is its number; a token sequence, or a list of them, its
    tokens."""
    return value if isinstance(value, int) else token_count(value)


def is_long(case: Case) -> bool:
    """A must-raise case is cheap whatever it asks for: a correct solution refuses up front. A
    swapped-cache proof is never left out (a quick run must not pass a recompute); the floors'
    long measured calls are, as every long case (a quick run is partial, never a pass)."""
    exempt = "must_raise" in case.inputs or is_swap(case)
    return case_size(case) > LONG_CASE_TOKENS and not exempt


def is_swap(case: Case) -> bool:
    """A cache-use proof drawn per run (every case of a decode stage swaps its cache too, but
    those are its graded cases, left out of a quick run when long like any other; a floor's
    cases swap too, but their floor is their fallback, left out as every long case)."""
    from theinference.curriculum.checks import CHECKS

    check = CHECKS.get(case.check)
    known = check is not None and check.swap is not None and check.flop is None
    return known and ("draw" in case.inputs or "drawn" in case.inputs)


def quick_draws(stage: Stage) -> Stage:
    """The stage as a quick run draws it: each swapped-cache proof (kept: see is_long) drawn
    from the range of the cases a quick run keeps, not the whole context's. Its ranged token
    inputs share the size of the largest of those cases."""
    kept = [case_size(c) for c in stage.cases if not drawn_per_run(c) and not is_long(c)]
    budget = max(kept, default=LONG_CASE_TOKENS)
    return replace(stage, cases=tuple(short_draw(c, budget) for c in stage.cases))


def short_draw(case: Case, budget: int) -> Case:
    template = case.inputs.get("draw")
    if not isinstance(template, dict) or not is_swap(case) or case_size(case) <= budget:
        return case
    ranged = {
        k: v
        for k, v in template.items()
        if isinstance(v, dict) and isinstance(v.get("random"), list)
    }
    cap = max(budget // max(len(ranged), 1), 1)
    short = {k: {**v, "random": [min(int(n), cap) for n in v["random"]]} for k, v in ranged.items()}
    return replace(case, inputs={**case.inputs, "draw": template | short})


def selected(case: Case, wanted: tuple[str, ...]) -> bool:
    return not wanted or any(w.lower() in case.name.lower() for w in wanted)


def plan(stage: Stage, policy: RunPolicy) -> CaseSelection:
    """Smallest first (stable: equal sizes keep the spec's order); filtered by the policy."""
    ordered = sorted(stage.cases, key=case_size)
    keep = tuple(
        c for c in ordered if selected(c, policy.cases) and not (policy.quick and is_long(c))
    )
    return CaseSelection(keep, tuple(c.name for c in ordered if c not in keep))
