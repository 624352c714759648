"""The student's language: which worker runs their code, and the names reports use.

Grading is the same in every language (stages, oracle, checks, fingerprints): only the worker
that runs the student's code, the files it lives in and the names in messages differ, and each
language states those once, in its own module here. A course is in the language its
theinference.toml names (`language = "ts"`), else in the one whose adapters file it has alone,
else in Python.
"""

from pathlib import Path

from theinference.course.languages.language import Language, LanguageError
from theinference.course.languages.python import PYTHON
from theinference.course.languages.typescript import TYPESCRIPT

__all__ = ["Language", "LanguageError", "PYTHON", "TYPESCRIPT", "ALL", "DEFAULT", "by_name",
           "parse", "by_files", "by_suffix"]

ALL = (PYTHON, TYPESCRIPT)
DEFAULT = PYTHON
NAMES = tuple(language.name for language in ALL)


def by_name(name: str) -> Language:
    """The language called `name`, as theinference.toml and `init --lang` say it."""
    for language in ALL:
        if language.name == name:
            return language
    raise LanguageError(f"unknown language {name!r}: choose one of {', '.join(NAMES)}")


def parse(said) -> Language | None:
    """theinference.toml's `language` value: None when it names none."""
    if said is None:
        return None
    if not isinstance(said, str) or said not in NAMES:
        raise LanguageError(f"'language' must be one of {', '.join(NAMES)}, not {said!r}")
    return by_name(said)


def by_files(root: Path) -> Language:
    """The language of a course that does not name one: the one whose adapters file it alone
    has, else the default."""
    found = [language for language in ALL if (root / language.adapters).is_file()]
    return found[0] if len(found) == 1 else DEFAULT


def by_suffix(suffix: str) -> Language | None:
    """The language a source file is written in, by its suffix (None: no language's)."""
    return next((lang for lang in ALL if suffix in lang.source_suffixes), None)
