"""`theinference verify`, for course authors: the grader checks itself against a reference
solution (which must pass) and every catalogued bug planted into it (each must fail its
stage, and be named by its own fingerprint where it has one).

The reference solution and the bug catalogue are the course authors' (never shipped to
students, nor in the package): a folder holding reference_kvcache.py and bugs.toml, by
default the source checkout's tests/solutions; an installed package needs --solutions.
"""

import tempfile
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from theinference.course import languages
from theinference.course.directory import init_course
from theinference.course.languages import Language
from theinference.course.languages.runner import RunnerError
from theinference.curriculum.stages import Stage
from theinference.grading.answers import Answers
from theinference.grading.grader import RunPlan, grade
from theinference.grading.policy import RunPolicy, plan, quick_draws
from theinference.oracle.weights import Weights
from theinference.results import RunResult, StageResult, Status
from theinference.results.events import ignore
from theinference.student import sandbox
from theinference.student.setup import ProcessSetup


class VerifyError(Exception):
    """The solutions folder is missing or malformed."""


@dataclass(frozen=True)
class PlantedBug:
    id: str
    stage: str
    old: str
    new: str
    also: tuple[tuple[str, str], ...] = ()
    fingerprint: str | None = None
    subtle: bool = False  # fails, but not far past the tolerance (e.g. erf vs tanh GELU)

    def planted(self, reference: str) -> str:
        for old, new in ((self.old, self.new), *self.also):
            if reference.count(old) != 1:
                raise VerifyError(
                    f"bug {self.id}: its edit must match the reference exactly "
                    f"once, not {reference.count(old)} times: {old!r}"
                )
            reference = reference.replace(old, new)
        return reference


@dataclass(frozen=True)
class Row:
    """One line of the verify table."""

    stage: str
    subject: str  # "reference" or a bug id
    status: Status
    ok: bool
    worst: float | None  # reference: its largest error; a bug: its smallest failing error,
    # both as multiples of the tolerance (None: the failure was not numeric)
    named: str | None = None
    expected_name: str | None = None


def default_solutions_dir() -> Path:
    """The source checkout's tests/solutions (absent from an installed package)."""
    return Path(__file__).resolve().parents[2] / "tests" / "solutions"


def load_bugs(path: Path) -> list[PlantedBug]:
    try:
        data = tomllib.loads(path.read_text())
        return [
            PlantedBug(
                id=b["id"],
                stage=b["stage"],
                old=b["old"],
                new=b["new"],
                also=tuple(tuple(pair) for pair in b.get("also", [])),
                fingerprint=b.get("fingerprint"),
                subtle=bool(b.get("subtle", False)),
            )
            for b in data["bugs"]
        ]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
        raise VerifyError(f"cannot read the bug catalogue {path}: {exc}") from None


def quick(stage: Stage) -> Stage:
    """The stage without its long cases (policy.LONG_CASE_TOKENS), its swapped-cache proofs
    drawn short: a bug that fails the small cases fails the stage."""
    return replace(stage, cases=plan(quick_draws(stage), RunPolicy(quick=True)).cases)


def named_bugs(stage: StageResult) -> set[str]:
    """Every bug the grader named for a stage: its diagnosis and what a judge recognised."""
    return {stage.suspected_bug, *(c.suspected_bug for c in stage.cases)} - {None}


@dataclass(frozen=True)
class Grounds:
    """What every verify run grades against: the weights and their answers, and the solutions
    folder (its language, and a TypeScript course's runner beside it)."""

    weights: Weights
    answers: Answers
    solutions: Path = Path()


def grade_text(kvcache: str, stages: list[Stage], grounds: Grounds, listener=ignore) -> RunResult:
    """Grade a kvcache text in a fresh course directory made from its language's template."""
    weights, solutions = grounds.weights, grounds.solutions
    language = solutions_language(solutions)
    with tempfile.TemporaryDirectory(prefix="theinference-verify-") as tmp:
        course = Path(tmp) / "course"
        init_course(course, language)
        (course / language.kvcache).write_text(kvcache)
        language.runner.link(course, solutions)
        chosen = None  # guardable: the grader's own user, measured calls guarded (account.py)
        if not language.guardable:
            # a uid of its own (a root grader), whose cgroup holds every process it starts
            chosen = sandbox.without_bwrap([])
        setup = ProcessSetup(course, weights.path, sandbox=chosen, language=language)
        return grade(setup, RunPlan(stages, weights, grounds.answers), listener)


def solutions_language(solutions: Path) -> Language:
    """The language whose reference solution the folder holds (reference_kvcache.ts: the
    TypeScript course's); the default's when none other's."""
    others = [lang for lang in languages.ALL if lang is not languages.DEFAULT]
    held = [lang for lang in others if (solutions / reference_name(lang)).is_file()]
    return held[0] if held else languages.DEFAULT


def reference_name(language: Language) -> str:
    return f"reference_{language.kvcache.name}"


def verify_reference(
    reference: str, stages: list[Stage], grounds: Grounds, listener=ignore
) -> list[Row]:
    run = grade_text(reference, stages, grounds, listener)
    rows = []
    for s in run.stages:
        worst = max((c.worst for case in s.cases for c in case.comparisons), default=None)
        named = ", ".join(sorted(named_bugs(s))) or None
        rows.append(
            Row(
                s.slug, "reference", s.status, s.status == Status.PASSED and not named, worst, named
            )
        )
    return rows


def verify_bug(
    bug: PlantedBug, reference: str, stage: Stage, grounds: Grounds, listener=ignore
) -> Row:
    run = grade_text(bug.planted(reference), [stage], grounds, listener)
    (result,) = run.stages
    failing = [c for c in result.cases if c.status != Status.PASSED]
    errors = [c.worst for case in failing for c in case.comparisons if not c.passed]
    named = named_bugs(result)
    fails = result.status in (Status.FAILED, Status.ERROR, Status.TIMEOUT)
    named_right = named == ({bug.fingerprint} if bug.fingerprint else set())
    return Row(
        result.slug,
        bug.id,
        result.status,
        fails and named_right,
        min(errors) if errors else None,
        ", ".join(sorted(named)) or None,
        bug.fingerprint,
    )


def verify(
    grounds: Grounds,
    stages: list[Stage],
    quick_run: bool,
    only: list[str],
    listener_for=lambda subject: ignore,  # a run's listener, given what it grades
) -> list[Row]:
    solutions = grounds.solutions
    language = solutions_language(solutions)
    reference_path = solutions / reference_name(language)
    if not reference_path.is_file():
        raise VerifyError(
            f"no reference solution at {reference_path}. verify needs the course authors' "
            "solutions, which the package does not ship: pass --solutions DIR (a folder with "
            "reference_kvcache.py or .ts and bugs.toml; a source checkout has tests/solutions)"
        )
    try:
        language.runner.beside(solutions)  # refused up front, not once per bug
    except RunnerError as exc:
        raise VerifyError(str(exc)) from None
    reference = reference_path.read_text()
    bugs = load_bugs(solutions / "bugs.toml")
    unknown = set(only) - {b.id for b in bugs}
    if unknown:
        raise VerifyError(f"unknown bug id(s): {', '.join(sorted(unknown))}")
    if quick_run:
        stages = [quick(s) for s in stages]
    by_slug = {s.slug: s for s in stages}
    rows = verify_reference(reference, stages, grounds, listener_for("reference"))
    for bug in bugs:
        if (not only or bug.id in only) and bug.stage in by_slug:
            stage, listener = by_slug[bug.stage], listener_for(bug.id)
            rows.append(verify_bug(bug, reference, stage, grounds, listener))
    return rows
