"""theinference.toml, checked: every key known, every value of its kind.

A typo must never be ignored in silence (`wieghts = "gpt2"` would grade against the default
weights), so an unknown key is an error that names the nearest valid one. The keys and their
meaning are documented in docs/instructors.md's "Course settings" table.
"""

import difflib
import math
from dataclasses import dataclass, field

from theinference.course import languages
from theinference.course.languages import Language, LanguageError

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
SEED_SOURCES = ("none", "env", "submission")  # or a whole number
SPEED_MODES = ("off", "report", "leaderboard")
TOP_KEYS = ("weights", "language", "grading")
GRADING_KEYS = (
    "stages",
    "scores",
    "visibility",
    "stage_visibility",
    "hidden_visibility",
    "partial_credit",
    "seed",
    "timeout",
    "memory_gb",
    "output_kb",
    "sandbox",
    "speed",
)


class SettingsError(ValueError):
    """A setting that is unknown or of the wrong kind; the message says which and what to do."""


@dataclass(frozen=True)
class Grading:
    """How an instructor grades: which stages, for how much, shown when, under what limits."""

    stages: tuple[str, ...] = ()  # empty: every stage
    scores: dict = field(default_factory=dict)  # slug -> points (default: the stage spec's)
    visibility: str = "visible"
    stage_visibility: dict = field(default_factory=dict)  # slug -> visibility
    hidden_visibility: str = "after_published"  # the seeded hidden cases' results
    partial_credit: bool = False  # a stage earns its share of passed cases
    seed: str | int = "env"  # none | env (THEINFERENCE_SEED) | submission | a number
    timeout: float | None = None  # seconds per adapter call
    memory_gb: float | None = None
    output_kb: int | None = None
    sandbox: str | None = None  # the weakest sandbox to grade in (None: auto, the strongest)
    speed: str = "off"  # off | report (JSON, class report) | leaderboard (and Gradescope's)

    def points(self, slug: str, spec_score: float) -> float:
        return float(self.scores.get(slug, spec_score))

    def visibility_of(self, slug: str) -> str:
        return self.stage_visibility.get(slug, self.visibility)


@dataclass(frozen=True)
class Settings:
    weights: str = "synthetic"
    language: Language | None = None  # None: not said (the course's files decide)
    grading: Grading = field(default_factory=Grading)


def nearest(key: str, valid: tuple[str, ...]) -> str:
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"did you mean '{near[0]}'? " if near else ""
    return f"{hint}Valid keys: {', '.join(valid)}"


def refuse_unknown(table: dict, valid: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in valid:
            raise SettingsError(f"unknown key '{key}' in {where}: {nearest(key, valid)}")


def parse_settings(data: dict) -> Settings:
    refuse_unknown(data, TOP_KEYS, "theinference.toml")
    weights = data.get("weights", "synthetic")
    if not isinstance(weights, str) or not weights:
        raise SettingsError("'weights' must be a non-empty string (synthetic, gpt2 or a path)")
    try:
        language = languages.parse(data.get("language"))
    except LanguageError as exc:
        raise SettingsError(str(exc)) from None
    grading = data.get("grading", {})
    if not isinstance(grading, dict):
        raise SettingsError("'grading' must be a table: [grading]")
    return Settings(weights, language, parse_grading(grading))


def parse_grading(table: dict) -> Grading:
    refuse_unknown(table, GRADING_KEYS, "[grading]")
    stages = table.get("stages", [])
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        raise SettingsError("[grading] stages must be a list of stage slugs")
    return Grading(
        stages=tuple(stages),
        scores=_numbers(table.get("scores", {}), "scores"),
        visibility=_visibility(table.get("visibility", "visible"), "visibility"),
        stage_visibility={
            slug: _visibility(v, f"stage_visibility.{slug}")
            for slug, v in _table(table.get("stage_visibility", {}), "stage_visibility").items()
        },
        hidden_visibility=_visibility(
            table.get("hidden_visibility", "after_published"), "hidden_visibility"
        ),
        partial_credit=_bool(table.get("partial_credit", False), "partial_credit"),
        seed=_seed(table.get("seed", "env")),
        timeout=_positive(table.get("timeout"), "timeout"),
        memory_gb=_positive(table.get("memory_gb"), "memory_gb"),
        output_kb=_whole(table.get("output_kb"), "output_kb"),
        sandbox=_sandbox(table.get("sandbox")),
        speed=_choice(table.get("speed", "off"), "speed", SPEED_MODES),
    )


def check_stage_names(grading: Grading, known: list[str]) -> None:
    """Every slug [grading] names must be a stage (a typo would drop a stage's points)."""
    named = [*grading.stages, *grading.scores, *grading.stage_visibility]
    for slug in named:
        if slug not in known:
            raise SettingsError(f"[grading] names unknown stage '{slug}': {nearest(slug, known)}")


def _table(value, name: str) -> dict:
    if not isinstance(value, dict):
        raise SettingsError(f"[grading] {name} must be a table of stage slug = value")
    return value


def _numbers(value, name: str) -> dict:
    table = _table(value, name)
    for slug, points in table.items():
        if isinstance(points, bool) or not isinstance(points, int | float) or points < 0:
            raise SettingsError(f"[grading] {name}.{slug} must be a number >= 0, not {points!r}")
    return {slug: float(points) for slug, points in table.items()}


def _visibility(value, name: str) -> str:
    return _choice(value, name, VISIBILITIES)


def _choice(value, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SettingsError(f"[grading] {name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def _bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"[grading] {name} must be true or false, not {value!r}")
    return value


def _seed(value) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if value in SEED_SOURCES:
        return value
    raise SettingsError(
        f"[grading] seed must be one of {', '.join(SEED_SOURCES)} or a whole number >= 0, "
        f"not {value!r}"
    )


def _positive(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise SettingsError(f"[grading] {name} must be a number > 0, not {value!r}")
    return float(value)


def _whole(value, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SettingsError(f"[grading] {name} must be a whole number > 0, not {value!r}")
    return value


SANDBOX_MINIMUMS = ("auto", "unprivileged-user", "bwrap")


def _sandbox(value) -> str | None:
    if value is None or value in SANDBOX_MINIMUMS:
        return value
    raise SettingsError(
        f"[grading] sandbox must be one of {', '.join(SANDBOX_MINIMUMS)} (the weakest sandbox "
        f"grading may use; auto: the strongest this machine has), not {value!r}"
    )
