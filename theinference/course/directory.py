"""The student's course directory: where it is, what it asks for, and making a new one."""

import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from theinference.course import languages
from theinference.course.languages import Language
from theinference.course.settings import Grading, Settings, SettingsError, parse_settings

TEMPLATE_DIR = languages.DEFAULT.template
SETTINGS_FILE = "theinference.toml"


class CourseError(Exception):
    """Not a usable course directory; the message says why and what to do."""


@dataclass(frozen=True)
class Course:
    root: Path
    weights: str  # as written in theinference.toml (default "synthetic")
    language: Language = languages.DEFAULT  # chosen once, here (languages/)
    grading: Grading = Grading()


def open_course(root: Path) -> Course:
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise CourseError(f"course directory {root} does not exist")
    settings = course_settings(root / SETTINGS_FILE)
    language = settings.language or languages.by_files(root)
    if not (root / language.adapters).is_file():
        raise CourseError(
            f"{root} is not a course directory (no {language.adapters}). "
            "Create one with: theinference init DIR"
        )
    try:
        language.check_runtime(root)
    except languages.LanguageError as exc:
        raise CourseError(str(exc)) from None
    return Course(root, settings.weights, language, settings.grading)


def course_language(root: Path) -> Language:
    """The language a folder's course is written in (a folder that is not yet a course, too):
    its settings' `language`, else the one its adapters file says."""
    root = root.expanduser().resolve()
    return course_settings(root / SETTINGS_FILE).language or languages.by_files(root)


def language_of(root: Path) -> Language:
    """course_language, or the default where the course's settings are unusable (for a
    process started on a course not opened: the worker's start reports the problem)."""
    try:
        return course_language(root)
    except CourseError:
        return languages.DEFAULT


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


def template_files(template: Path = TEMPLATE_DIR) -> list[Path]:
    """Template files relative to the template root (caches, bytecode, node_modules left out)."""
    return sorted(
        p.relative_to(template)
        for p in template.rglob("*")
        if p.is_file() and not {"__pycache__", "node_modules"} & set(p.parts)
    )


def init_course(root: Path, language: Language = languages.DEFAULT) -> list[Path]:
    """Copy the language's template into root; refuse if any file it would write exists."""
    root = root.expanduser().resolve()
    template = language.template
    files = template_files(template)
    clashes = [f for f in files if (root / f).exists()]
    if clashes:
        raise CourseError(
            f"{root} already has {', '.join(str(c) for c in clashes)}: not overwriting a "
            "student's files. Choose an empty or new directory."
        )
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template / rel, root / rel)
    return files
