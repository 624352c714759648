"""What a student's language is to the grader: one frozen object per language, every way the
languages differ stated once, as data (a higher layer, e.g. the student's process, reads it)."""

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace
from functools import cached_property
from pathlib import Path

from theinference.course.languages.runner import NO_RUNNER, NoRunner, Runner

TEMPLATES = Path(__file__).parents[1] / "templates"
LOCALIZED_FIELDS = ("message", "hint", "reason", "bug_name")


class LanguageError(Exception):
    """The course's language cannot run here, or is not one; the message says what fixes it."""


@dataclass(frozen=True, eq=False)  # one object per language: compared by identity
class Language:
    name: str  # as theinference.toml's `language` and `init --lang` say it
    title: str  # as reports name it
    template: Path  # what `init` copies
    adapters: Path  # in the course: the file that marks a course of this language
    kvcache: Path  # in the course: the student's own implementation
    source_suffixes: tuple[str, ...]  # the language's source files (similarity, --watch)
    worker: str  # the worker script in student/worker/ that runs the student's code
    runtime: str  # what runs the worker: python | node (student/launch.py builds its argv)
    guardable: bool  # its worker installs the no-new-process filter itself (account.py)
    calibration: tuple[int, int, int, int]  # the matrix product rated: m, k, n, repeats
    check_runtime: Callable[[Path], None] = lambda root: None  # raises LanguageError
    names: dict[str, str] = field(default_factory=dict)  # Python names -> their spelling here
    # Python exceptions -> the ones thrown here instead (in `names` too, for the reports)
    exceptions: dict[str, str] = field(default_factory=dict)
    first_steps: str = ""  # what `init` tells the student to run before the first test
    runner: Runner | NoRunner = NO_RUNNER  # what a course needs installed beside it to run
    setup_lines: str = ""  # the Gradescope image's setup.sh lines for the runtime
    provided_kernel: tuple[str, ...] = ()  # calibration multiplies through these, if any
    earlier_kernels: frozenset = frozenset()  # digests of earlier releases' kernel pairs
    notebook: bool = False  # `init --notebook` writes its course as a Jupyter notebook

    @property
    def own_code(self) -> tuple[str, ...]:
        """The student's own files, as the course keeps them (similarity compares these)."""
        return (self.kvcache.as_posix(), self.adapters.as_posix())

    def spelled(self, name: str) -> str:
        """A name the grader asks the worker for (an adapter, a hook), as the course spells it
        here: the worker looks it up as it is sent."""
        return self.names.get(name, name)

    def grader_exception(self, reported: str) -> str:
        """An exception's type name as the worker reported it, read back as the grader judges
        it (Python's: a TypeScript RangeError is the refusal, ValueError)."""
        return next((ours for ours, here in self.exceptions.items() if here == reported), reported)

    @cached_property
    def _names_pattern(self) -> re.Pattern:
        """Whole words only, longest first where one name contains another."""
        longest = sorted(self.names, key=len, reverse=True)
        return re.compile("|".join(rf"(?<![\w.]){re.escape(k)}(?![\w])" for k in longest))

    def localize(self, text: str) -> str:
        """Python names in a message, hint or guidance, spelled as this language has them."""
        if not self.names or not text:
            return text
        return self._names_pattern.sub(lambda m: self.names[m.group(0)], text)

    def localize_result(self, value):
        """A copy of a result (run, stage or case) with every message, hint and reason
        localized."""
        if not self.names:
            return value
        if isinstance(value, list):
            return [self.localize_result(v) for v in value]
        if not is_dataclass(value) or isinstance(value, type):
            return value
        changes = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.name in LOCALIZED_FIELDS and isinstance(item, str):
                changes[f.name] = self.localize(item)
            elif f.name in ("stages", "cases"):
                changes[f.name] = self.localize_result(item)
        return replace(value, **changes)

    def localizing(self, listener):
        """A run listener that hears results (case, stage, run) in this language's names."""
        if not self.names:
            return listener

        def forward(event) -> None:
            if is_dataclass(event) and hasattr(event, "result"):
                event = replace(event, result=self.localize_result(event.result))
            listener(event)

        return forward
