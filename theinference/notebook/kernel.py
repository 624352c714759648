"""Checks from a running kernel: the kernel's course, rewritten from its cells before each check
and graded by the same session as `theinference test`.

No notebook file and no course directory are needed (Colab's case): the cells come from the
kernel's input history, the stages and the weights from the installed package. The student's
functions never run in the kernel: they run in the grader's student process, so one that
raises, loops or returns garbage costs its case, never the kernel.
"""

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from theinference.course.directory import SETTINGS_FILE, CourseError, init_course
from theinference.course.notebook import MAGIC_LINE, Extracted, course_files, extract
from theinference.curriculum.stages import StageError, load_stages, select
from theinference.oracle.checkpoint import WeightsError
from theinference.results import RunResult
from theinference.student.sandbox import SandboxError

Cells = Callable[[], list[tuple[str, str]]]  # the kernel's code cells, (label, source)
PROBLEMS = (CourseError, StageError, WeightsError, SandboxError)


@dataclass(frozen=True)
class Settings:
    """How the kernel's checks grade. No sandbox by default: it is the student's own code on
    their own machine; every report says which mode ran."""

    weights: str = "synthetic"  # or "gpt2" (the Hub), or a .safetensors path
    sandbox: str = "none"
    timeout: float | None = None  # seconds per call; None: each stage's
    quick: bool = False  # leave out the long cases (the check then says it is partial)
    # as `test --watch`: each stage stops at its first failing case (a second confirms a bug),
    # so a function that loops costs one timeout, not one per case; by default every case
    # runs, as `theinference test` does, and a failure's map is drawn where any case has one
    first_failure: bool = False


class Checked:
    """A check's outcome; a notebook shows it as HTML, a console as the report's text."""

    def __init__(self, run: RunResult | None, notes: list[str], problem: str = ""):
        self.run, self.notes, self.problem = run, notes, problem

    @property
    def passed(self) -> bool:
        return self.run is not None and self.run.passed

    def _repr_html_(self) -> str:
        from theinference.output.notebook import check_html, problem_html

        if self.run is None:
            return problem_html(self.problem, self.notes)
        return check_html(self.run, self.notes)

    def __repr__(self) -> str:
        from theinference.output.notebook import check_text

        return f"theinference: {self.problem}" if self.run is None else check_text(self.run)


class KernelCourse:
    """The kernel's course directory (made from the template, in a folder of its own), the
    settings its checks use and their sessions, kept so a rerun reuses the oracle's answers."""

    def __init__(self, cells: Cells):
        self.cells = cells
        self.root = Path(tempfile.mkdtemp(prefix="theinference-notebook-")) / "course"
        self.root.parent.chmod(0o755)  # a root grader's student uid reads it
        init_course(self.root)
        atexit.register(shutil.rmtree, self.root.parent, ignore_errors=True)
        self.settings = Settings()
        self.sessions: dict = {}  # (weights, sandbox, timeout) -> the session they prepare
        if str(self.root) not in sys.path:  # `from src.gpt2 import ...` in the kernel too
            sys.path.append(str(self.root))

    def configure(self, **changes) -> Settings:
        """Change how the kernel's checks grade (weights, sandbox, timeout, quick,
        first_failure)."""
        self.settings = self.with_settings(changes)
        if "weights" in changes:
            self.point_weights()
        return self.settings

    def with_settings(self, changes: dict) -> Settings:
        unknown = set(changes) - set(Settings.__dataclass_fields__)
        if unknown:
            raise TypeError(f"no setting {', '.join(sorted(unknown))}: the settings are "
                            f"{', '.join(Settings.__dataclass_fields__)}")
        return replace(self.settings, **changes)

    def point_weights(self) -> None:
        """THEINFERENCE_WEIGHTS for the kernel, so `load_weights()` reads in a cell the
        weights the checks grade against (loaded once, for the checks too)."""
        try:
            os.environ["THEINFERENCE_WEIGHTS"] = str(self.prepared(self.settings).weights.path)
        except PROBLEMS as exc:  # told again by the first check
            print(f"theinference: {exc}", file=sys.stderr)

    def check(self, *stages: str, case: str | list[str] | None = None, **asked) -> Checked:
        """Grade the stages named (none: every stage) on the kernel's cells as they are now:
        only the cases whose name contains `case` (or one of several), if given; `asked`
        settings (e.g. quick=True) are for this check only."""
        if len(stages) == 1 and isinstance(stages[0], list | tuple):  # check(["a", "b"])
            stages = tuple(stages[0])
        found, notes = self.write_course(), []
        magic = {label for label, source in self.cells() if MAGIC_LINE.search(source)}
        for label in found.unparsable:  # the kernel told the rest when they ran
            if label in magic:
                notes.append(f"{label} was left out: without its magic and shell lines (%..., "
                             "!...) it is not valid Python")
        try:
            cases = (case,) if isinstance(case, str) else tuple(case or ())
            session = self.session(tuple(stages), self.with_settings(asked), cases)
            from theinference.grading.session import run

            return Checked(run(session, listener=progress), notes)
        except PROBLEMS as exc:
            return Checked(None, notes, str(exc))

    def write_course(self) -> Extracted:
        found = extract(self.cells())
        for path, data in course_files(found).items():
            (self.root / path).write_bytes(data)
        return found

    def prepared(self, settings: Settings):
        """The session of every check with these weights, sandbox and timeout, prepared once:
        the weights are checked once and the oracle's answers kept across checks."""
        from theinference.grading.session import LimitRequest, Presentation, RunRequest, prepare
        from theinference.output.report import print_notice

        key = (settings.weights, settings.sandbox, settings.timeout)
        if key not in self.sessions:
            request = RunRequest(weights=weights_here(settings.weights), sandbox=settings.sandbox,
                                 limits=LimitRequest(timeout=settings.timeout))
            self.sessions[key] = prepare(self.root, request, Presentation(notice=print_notice))
        return self.sessions[key]

    def session(self, stages: tuple[str, ...], settings: Settings, cases: tuple[str, ...]):
        """The prepared session narrowed to a check's stages, cases and policy, as `prepare`
        narrows it for `theinference test --stage S --case C`."""
        from theinference.grading.policy import RunPolicy
        from theinference.grading.provenance import provenance
        from theinference.grading.seed import NO_SEED
        from theinference.grading.session import filtered

        select(load_stages(), list(stages))  # an unknown stage is told before any wait
        base = self.prepared(settings)
        chosen = select(base.all_stages, list(stages))
        if cases:
            chosen = filtered(chosen, cases, named=bool(stages))
        policy = RunPolicy(stop_at_first_failure=settings.first_failure, quick=settings.quick,
                           cases=cases)
        settings_toml = (self.root / SETTINGS_FILE).read_bytes()
        produced = provenance([s.slug for s in chosen], settings_toml, base.weights.sha256,
                              NO_SEED)
        return replace(base, stages=chosen, policy=policy, provenance=produced)


def progress(event) -> None:
    """A line per stage as it starts: a long check is seen to be working."""
    from theinference.results.events import StageStarted

    if isinstance(event, StageStarted):
        print(f"checking {event.slug} ({event.cases} cases)...", flush=True)


def weights_here(spec: str) -> str:
    """A weights file's path as the kernel means it: from its working directory, not the
    course's folder it grades in."""
    if spec in ("synthetic", "gpt2"):
        return spec
    return str(Path(spec).expanduser().resolve())
