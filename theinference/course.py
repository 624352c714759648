"""The student's course directory: where it is, what it asks for, and making a new one."""

import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from theinference.settings import Grading, Settings, SettingsError, parse_settings

TEMPLATE_DIR = Path(__file__).with_name("student_template")
SETTINGS_FILE = "theinference.toml"
ADAPTERS_FILE = Path("tests/adapters.py")


class CourseError(Exception):
    """Not a usable course directory; the message says why and what to do."""


@dataclass(frozen=True)
class Course:
    root: Path
    weights: str  # as written in theinference.toml (default "synthetic")
    language: str = "python"  # python | ts
    grading: Grading = Grading()


def open_course(root: Path) -> Course:
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise CourseError(f"course directory {root} does not exist")
    if not (root / ADAPTERS_FILE).is_file():
        raise CourseError(
            f"{root} is not a course directory (no {ADAPTERS_FILE}). "
            "Create one with: theinference init DIR"
        )
    settings = course_settings(root / SETTINGS_FILE)
    return Course(root, settings.weights, settings.language, settings.grading)


def course_settings(path: Path) -> Settings:
    """theinference.toml checked against the settings schema (settings.py)."""
    try:
        return parse_settings(read_settings(path))
    except SettingsError as exc:
        raise CourseError(f"{path}: {exc}") from None


def read_settings(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CourseError(f"{path} is not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CourseError(f"cannot read {path}: {exc}") from None


def template_files() -> list[Path]:
    """Template files relative to the template root (caches and bytecode left out)."""
    return sorted(
        p.relative_to(TEMPLATE_DIR)
        for p in TEMPLATE_DIR.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def init_course(root: Path) -> list[Path]:
    """Copy the template into root; refuse if any file it would write already exists."""
    root = root.expanduser().resolve()
    files = template_files()
    clashes = [f for f in files if (root / f).exists()]
    if clashes:
        raise CourseError(
            f"{root} already has {', '.join(str(c) for c in clashes)}: not overwriting a "
            "student's files. Choose an empty or new directory."
        )
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TEMPLATE_DIR / rel, root / rel)
    return files
