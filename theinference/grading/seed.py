"""The hidden cases' seed, resolved once, with where it came from.

Every entry point asks `resolve_seed` with what it was given: a command line's --seed wins, then
the instructor's `[grading] seed` (`none`, a number, `env` or `submission`); `theinference test`
reads THEINFERENCE_SEED as `env`. The source travels with the value into the provenance
(provenance.seed_label), never guessed back from the environment afterwards.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

SEED_VAR = "THEINFERENCE_SEED"
SUBMISSION_METADATA = "submission_metadata.json"  # Gradescope's, beside the submission


class SeedError(ValueError):
    """A seed the environment gives that is not a whole number >= 0."""


@dataclass(frozen=True)
class Seed:
    value: int | None = None
    source: str = "none"  # none | option | env | fixed | submission


NO_SEED = Seed()


def resolve_seed(option: int | None, setting: int | str = "env",
                 submission_root: Path | None = None) -> Seed:
    """The seed a run grades with: the option, else what `setting` names."""
    if option is not None:
        return Seed(option, "option")
    if isinstance(setting, int):
        return Seed(setting, "fixed")
    if setting == "submission":
        return Seed(submission_id(submission_root), "submission")
    if setting == "env":
        return seed_from_environment()
    return NO_SEED


def seed_from_environment() -> Seed:
    text = os.environ.get(SEED_VAR, "").strip()
    if not text:
        return NO_SEED
    if not text.isdigit():
        raise SeedError(f"{SEED_VAR} must be a whole number >= 0, not {text!r}")
    return Seed(int(text), "env")


def submission_id(root: Path | None) -> int | None:
    """Gradescope's submission id (submission_metadata.json), so a resubmission draws anew."""
    try:
        return int(json.loads((root / SUBMISSION_METADATA).read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
