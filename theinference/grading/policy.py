"""How a run spends its time: which cases run, in what order, and when a stage stops early.

Cases run smallest first, the size being the number of tokens the case hands the student's
code (sequence, prompt, continuation, every prompt of a batch, plus the new tokens asked
for): a one-token case answers in milliseconds, and a bug shows there as well as anywhere.
Long cases (the whole context) therefore run last; `quick` leaves them out.
"""

from dataclasses import dataclass

from theinference.curriculum.stages import Case, Stage

LONG_CASE_TOKENS = 300  # more than this is a long case: last, and left out by --quick
TOKEN_INPUTS = ("seq", "prompt", "continuation")


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
        return int(spec.get("random", spec.get("times", 0)))
    if isinstance(spec, list):
        return sum(token_count(item) if isinstance(item, dict | list) else 1 for item in spec)
    return 1


def case_size(case: Case) -> int:
    """The tokens a case hands the student's code, new tokens asked for included."""
    inputs = case.inputs
    size = sum(token_count(inputs[k]) for k in TOKEN_INPUTS if k in inputs)
    size += sum(token_count(p) for p in inputs.get("prompts", []))
    return size + int(inputs.get("max_new_tokens", 0))


def is_long(case: Case) -> bool:
    """A must-raise case is cheap whatever it asks for: a correct solution refuses up front."""
    return case_size(case) > LONG_CASE_TOKENS and "must_raise" not in case.inputs


def selected(case: Case, wanted: tuple[str, ...]) -> bool:
    return not wanted or any(w.lower() in case.name.lower() for w in wanted)


def plan(stage: Stage, policy: RunPolicy) -> CaseSelection:
    """Smallest first (stable: equal sizes keep the spec's order); filtered by the policy."""
    ordered = sorted(stage.cases, key=case_size)
    keep = tuple(
        c for c in ordered if selected(c, policy.cases) and not (policy.quick and is_long(c))
    )
    return CaseSelection(keep, tuple(c.name for c in ordered if c not in keep))
