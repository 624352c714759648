"""`pytest` in a course directory grades it: the pytest plugin (entry point `pytest11`).

A course's adapters file (tests/adapters.py, or tests/adapters.ts, beside theinference.toml)
is collected as the course's stages, a node per stage and an item per case
(`tests/adapters.py::full-decode-step::one-token prompt`); nothing else is touched, so pytest
runs as before everywhere else. The first item of a stage to run grades the whole stage once
through the same run as `theinference test` (its own sandboxed student process, the same
checks and diagnosis), and each item reports its case from that result: a failure's text is
the terminal's log form of the case and the stage's diagnosis. The student's code is never
imported here; the grader's own modules are, for a file named adapters.* (NumPy only in a
course).
"""

from dataclasses import replace
from pathlib import Path

import pytest

SEED_OPTION = "--theinference-seed"
SEED_ENV = "THEINFERENCE_SEED"  # as for `theinference test`


def pytest_addoption(parser) -> None:
    parser.getgroup("theinference").addoption(
        SEED_OPTION, type=int, default=None, metavar="N",
        help=f"Course directories: add the hidden cases drawn with this seed (else ${SEED_ENV}).",
    )


def pytest_collect_file(file_path: Path, parent):
    """A course's adapters file, where pytest runs in that course: its rootdir (the course's
    pytest.ini makes it so) is the course directory or inside it. A course lying deeper in a
    project (a test fixture) is not graded by that project's pytest."""
    if not file_path.name.startswith("adapters."):
        return None
    root = course_root(file_path)
    rootdir = Path(parent.config.rootpath).resolve()
    if root is None or not rootdir.is_relative_to(root.resolve()):
        return None
    return CourseFile.from_parent(parent, path=file_path)


def course_root(adapters: Path) -> Path | None:
    """The course directory whose adapters file this is: tests/ of a directory that holds
    theinference.toml, when the course's language reads this file."""
    from theinference.course import languages
    from theinference.course.directory import SETTINGS_FILE, CourseError, course_language

    root = adapters.parent.parent
    if adapters.parent.name != "tests" or not (root / SETTINGS_FILE).is_file():
        return None
    try:
        wanted = [course_language(root).adapters]
    except CourseError:  # its run says what is wrong with the settings
        wanted = [language.adapters for language in languages.ALL]
    return root if any(adapters == root / rel for rel in wanted) else None


def pytest_collection_finish(session) -> None:
    """After -k, --lf and the like: the cases each stage will be asked for."""
    for item in session.items:
        if isinstance(item, CaseItem):
            item.runs.selected.setdefault(item.stage.slug, set()).add(item.case.name)


def pytest_terminal_summary(terminalreporter) -> None:
    """The runs' notes (how the student's process was isolated, the weights), as the
    terminal report ends with them."""
    for runs in terminalreporter.config.stash.get(COURSES, {}).values():
        for note in dict.fromkeys(runs.notes):
            terminalreporter.write_line(f"theinference note: {note}")


class CourseFile(pytest.File):
    """A course's adapters file: its stages, in course order."""

    def collect(self):
        from theinference.grading.session import course_stages

        runs = CourseRuns.of(self.config, self.path.parent.parent, self.seed())
        for stage in course_stages(seed=runs.seed.value):
            yield StageNode.from_parent(self, name=stage.slug, stage=stage, runs=runs)

    def seed(self):
        """--theinference-seed, else THEINFERENCE_SEED: resolved once, as `theinference test`
        resolves it (grading/seed.py)."""
        from theinference.grading.seed import SeedError, resolve_seed

        given = self.config.getoption(SEED_OPTION)
        if given is not None and given < 0:
            raise self.CollectError(f"{SEED_OPTION}: a whole number >= 0, not {given}")
        try:
            return resolve_seed(given, "env")
        except SeedError as exc:
            raise self.CollectError(str(exc)) from None


class StageNode(pytest.Class):
    """A stage: its cases in the order a run takes them (smallest first). A Class to pytest,
    though no Python class stands behind it, so that editors' test trees (VS Code's nests
    items under classes only) group a stage's cases under it."""

    def __init__(self, *, stage, runs, **kwargs):
        super().__init__(**kwargs)
        self.stage, self.runs = stage, runs

    def collect(self):
        from theinference.grading.policy import EVERY_CASE, plan

        for case in plan(self.stage, EVERY_CASE).cases:
            yield CaseItem.from_parent(self, name=case.name, case=case)


class CaseFailed(Exception):
    """A case that did not pass; its text is the whole report."""


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case, self.stage, self.runs = case, self.parent.stage, self.parent.runs
        self.seconds: float | None = None  # its case's own time, once graded

    def runtest(self) -> None:
        from theinference.output.plain import case_text, not_started_text
        from theinference.results import Status

        result = self.runs.result(self.stage.slug)
        if isinstance(result, str):  # the course cannot be graded: the reason, no traceback
            raise CaseFailed(f"theinference: {result}")
        case = result.case(self.case.name)
        if result.status == Status.SKIPPED:
            raise skip(f"{result.slug}: {result.reason}")
        if case is None:  # left after a first case that is todo
            raise skip(not_started_text(result))
        self.seconds = own_seconds(result, case)
        if case.status != Status.PASSED:
            told_under = self.runs.told.setdefault(result.slug, case.name)
            raise CaseFailed(case_text(result, case.name, "" if told_under == case.name
                                       else f"'{told_under}'"))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, self.runs.adapter_line(self.path, self.case.check), (
            f"{self.stage.slug}: {self.case.name}")


def own_seconds(result, case) -> float:
    """A case's time: its student call's and the oracle's, scaled so that its stage's cases
    never sum past the stage's own time (the oracle works while the student's code runs,
    and a stage's long cases run beside the others: their times overlap)."""
    total = sum(c.student_seconds + c.oracle_seconds for c in result.cases)
    scale = min(1.0, result.seconds / total) if total > 0 and result.seconds > 0 else 1.0
    return (case.student_seconds + case.oracle_seconds) * scale


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A case's call takes the time of its own case (its student call and the oracle's), not
    the whole stage's, which the first of its cases to run grades: junit.xml's times, and
    --durations, are per case."""
    report = yield
    if isinstance(item, CaseItem) and call.when == "call" and item.seconds is not None:
        report.duration = item.seconds
    return report


def skip(reason: str) -> Exception:
    """A skip reported at the case (pytest's -rs names the item, not this module)."""
    return pytest.skip.Exception(reason, _use_item_location=True)


class CourseRuns:
    """One course's grading in this pytest session: the session prepared once, each stage
    graded once (its prerequisites first, as a run of them all would), its result kept."""

    def __init__(self, root: Path, seed):
        self.root, self.seed = root, seed
        self.selected: dict[str, set[str]] = {}  # stage slug -> the case names to run
        self.results: dict[str, object] = {}  # stage slug -> StageResult, or why none
        self.session = None
        self.unusable = ""  # why the course cannot be graded, once found
        self.notes: list[str] = []  # the runs' notes, said once at the end
        self.told: dict[str, str] = {}  # stage slug -> the case whose failure said its diagnosis
        self.lines: dict[str, int] = {}  # check -> its adapter's line in the adapters file

    def adapter_line(self, adapters: Path, check: str) -> int:
        """Where the check's adapter is defined in the adapters file (0-based, as pytest
        counts), so that an editor's "go to test" lands on it; 0 where it cannot be found."""
        if check not in self.lines:
            self.lines[check] = adapter_line(adapters, check)
        return self.lines[check]

    @classmethod
    def of(cls, config, root: Path, seed) -> "CourseRuns":
        courses = config.stash.setdefault(COURSES, {})
        return courses.setdefault(root, cls(root, seed))

    def result(self, slug: str):
        if slug not in self.results:
            self.results[slug] = self.graded(slug)
        return self.results[slug]

    def graded(self, slug: str):
        from theinference.commands.options import user_error
        from theinference.grading.prerequisites import first_blocker, skipped

        if self.unusable:
            return self.unusable
        try:
            session = self.prepared()
            stage = next(s for s in session.all_stages if s.slug == slug)
            done = {r: self.result(r) for r in stage.requires if r in self.selected}
            if any(isinstance(r, str) for r in done.values()):
                return next(r for r in done.values() if isinstance(r, str))
            blocker = first_blocker(stage, done)
            return skipped(stage, blocker) if blocker else self.run_stage(session, stage)
        except Exception as exc:
            found = user_error(exc)
            if found is None:
                raise
            self.unusable = found[0]
            return found[0]

    def prepared(self):
        from theinference.grading.session import RunRequest, prepare

        if self.session is None:
            self.session = prepare(self.root, RunRequest(seed=self.seed))
        return self.session

    def run_stage(self, session, stage):
        """The stage's selected cases (every case unless -k, --lf or a node id chose some),
        graded in one run: one student process."""
        from theinference.grading.policy import RunPolicy
        from theinference.grading.session import run

        wanted = self.selected.get(stage.slug, set())
        every = {c.name for c in stage.cases}
        policy = RunPolicy(cases=() if wanted >= every else tuple(sorted(wanted)))
        result = run(replace(session, policy=policy), [stage])
        self.notes += result.notes
        return result.stages[0]


def adapter_line(adapters: Path, check: str) -> int:
    """The line defining the check's adapter, as the course's language spells its name."""
    import re

    from theinference.course.directory import CourseError, course_language
    from theinference.curriculum.checks import CHECKS

    try:
        name = re.escape(course_language(adapters.parent.parent).spelled(CHECKS[check].adapter))
        text = adapters.read_text(errors="replace")
    except (CourseError, OSError, KeyError):
        return 0
    found = re.search(rf"^[ \t]*(?:export\s+)?(?:async\s+)?(?:def|function)\s+{name}\b"
                      rf"|^[ \t]*(?:export\s+)?(?:const|let|var)\s+{name}\s*=", text, re.M)
    return text.count("\n", 0, found.start()) if found else 0


COURSES = pytest.StashKey[dict]()  # course root -> its CourseRuns, for this pytest session
