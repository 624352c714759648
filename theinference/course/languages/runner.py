"""A language's runner: what a course of it needs in its folder to run beyond the interpreter
(the TypeScript course's tsx, from the template's pinned package-lock.json), installed once
per machine and lock file into the grader's cache directory, then copied into each course a
class grades (a sandbox sees the course folder alone, so a link out of it would dangle).
A language with nothing to install (Python) has NO_RUNNER, which installs and copies nothing.

THEINFERENCE_NODE_MODULES names a ready node_modules to use instead (offline machines, tests).
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

READY_ENV = "THEINFERENCE_NODE_MODULES"
LOCK_FILES = ("package.json", "package-lock.json")
# the compiler and Node's type declarations are for students' own type checks, not for grading
NOT_COPIED = {"typescript", "@types"}
INSTALL_TIMEOUT = 900.0
OUTPUT_KEPT = 2000

_installing = threading.Lock()  # grade's threads: one installs, the others wait for it


class RunnerError(Exception):
    """The runner cannot be had here; the message says why and what fixes it."""


@dataclass(frozen=True)
class Runner:
    """Node modules a course of the language runs its worker with: `entry`, a file in the
    course that shows they are there; `template`, the folder whose lock files pin them."""

    entry: Path
    template: Path

    @property
    def in_modules(self) -> Path:
        """`entry` within node_modules (tsx/package.json): what a ready node_modules holds."""
        return Path(*self.entry.parts[1:])

    def lock_digest(self) -> str:
        """The template's pinned runner, by its lock file's content."""
        return hashlib.sha256((self.template / "package-lock.json").read_bytes()).hexdigest()

    def shared(self, cache: Path) -> Path:
        """A node_modules holding the template's pinned runner: READY_ENV's, or the one
        installed (`npm ci`, once) under the grader's cache directory `cache`."""
        given = os.environ.get(READY_ENV)
        if given:
            modules = Path(given)
            if not (modules / self.in_modules).is_file():
                raise RunnerError(f"{READY_ENV}={given} holds no tsx/package.json")
            return modules
        home = cache / f"{self.template.name}-runner" / self.lock_digest()[:16]
        with _installing, _file_lock(home.with_name(home.name + ".lock")):
            if not (home / self.entry).is_file():
                _install(home, self)
        return home / "node_modules"

    def give(self, course: Path, cache: Path) -> None:
        """The shared runner as the course's own node_modules (give_runner)."""
        give_runner(course, self.shared(cache))

    def link(self, course: Path, solutions: Path) -> None:
        """`verify`'s course: a link to the runner prepared beside the solutions (a course
        graded in place, as the grader's own user)."""
        (course / "node_modules").symlink_to(self.beside(solutions))

    def beside(self, solutions: Path) -> Path:
        """$THEINFERENCE_NODE_MODULES, else the one `npm ci` prepares in tests/fixtures/ts_runner
        beside the solutions; refused, saying how to make it, where there is none."""
        fixture = solutions.resolve().parent / "fixtures" / "ts_runner"
        found = Path(os.environ.get(READY_ENV) or fixture / "node_modules")
        if not (found / self.in_modules).is_file():
            raise RunnerError(
                f"no TypeScript runner at {found}: run `npm ci --prefix {fixture}` once "
                f"(or point {READY_ENV} at a node_modules holding tsx)"
            )
        return found


@dataclass(frozen=True)
class NoRunner:
    """A language whose worker needs nothing in the course beyond the interpreter."""

    def shared(self, cache: Path) -> None:
        return None

    def give(self, course: Path, cache: Path) -> None:
        return None

    def link(self, course: Path, solutions: Path) -> None:
        return None

    def beside(self, solutions: Path) -> None:
        return None


NO_RUNNER = NoRunner()


def _install(home: Path, runner: Runner) -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RunnerError(
            "grading TypeScript submissions needs Node.js 20 or later and npm on PATH "
            "(apt-get install nodejs npm, or https://nodejs.org)"
        )
    staging = home.with_name(home.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in LOCK_FILES:
        shutil.copyfile(runner.template / name, staging / name)
    try:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=staging, capture_output=True, text=True,
            timeout=INSTALL_TIMEOUT, check=False,
        )
    except subprocess.TimeoutExpired:
        raise RunnerError(f"npm ci did not finish in {INSTALL_TIMEOUT:g} s") from None
    if done.returncode != 0 or not (staging / runner.entry).is_file():
        tail = (done.stdout + done.stderr).strip()[-OUTPUT_KEPT:]
        raise RunnerError(f"installing the TypeScript runner (npm ci) failed: {tail}")
    shutil.rmtree(home, ignore_errors=True)
    staging.rename(home)


def _file_lock(path: Path):
    """An exclusive lock held while the `with` block runs: graders on one machine (shards,
    several `grade` commands) install the runner once."""

    class Held:
        def __enter__(self):
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w")  # noqa: SIM115 (held until __exit__)
            fcntl.flock(self.file, fcntl.LOCK_EX)

        def __exit__(self, *exc):
            self.file.close()

    return Held()


def give_runner(course: Path, modules: Path) -> None:
    """The runner as the course's own node_modules: hard links where the file system allows,
    copies elsewhere (what is linked is read-only to the student's process: the grader's)."""
    target = course / "node_modules"
    shutil.rmtree(target, ignore_errors=True)

    def ignore(folder: str, names: list[str]) -> set[str]:
        return NOT_COPIED & set(names) if Path(folder) == modules else set()

    try:
        shutil.copytree(modules, target, symlinks=True, ignore=ignore, copy_function=os.link)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(modules, target, symlinks=True, ignore=ignore)
