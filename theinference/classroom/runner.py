"""The TypeScript runner a class shares: the course template's pinned node_modules (tsx, from
its package-lock.json), installed once per machine and lock file into the cache directory, then
copied into each TypeScript submission's course (a sandbox sees the course folder alone, so a
link out of it would dangle).

THEINFERENCE_NODE_MODULES names a ready node_modules to use instead (offline machines, tests).
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from theinference.course.languages import Language
from theinference.oracle.weights import cache_dir

READY_ENV = "THEINFERENCE_NODE_MODULES"
LOCK_FILES = ("package.json", "package-lock.json")
# the compiler and Node's type declarations are for students' own type checks, not for grading
NOT_COPIED = {"typescript", "@types"}
INSTALL_TIMEOUT = 900.0
OUTPUT_KEPT = 2000

_installing = threading.Lock()  # grade's threads: one installs, the others wait for it


class RunnerError(Exception):
    """The runner cannot be had here; the message says why and what fixes it."""


def lock_digest(language: Language) -> str:
    """The template's pinned runner, by its lock file's content."""
    return hashlib.sha256((language.template / "package-lock.json").read_bytes()).hexdigest()


def runner_modules(language: Language) -> Path:
    """A node_modules holding the template's pinned runner: READY_ENV's, or the one installed
    (`npm ci`, once) under the cache directory."""
    given = os.environ.get(READY_ENV)
    if given:
        modules = Path(given)
        if not (modules / "tsx" / "package.json").is_file():
            raise RunnerError(f"{READY_ENV}={given} holds no tsx/package.json")
        return modules
    home = cache_dir() / f"{language.name}-runner" / lock_digest(language)[:16]
    with _installing, _file_lock(home.with_name(home.name + ".lock")):
        if not (home / language.runner_entry).is_file():
            _install(home, language)
    return home / "node_modules"


def _install(home: Path, language: Language) -> None:
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
        shutil.copyfile(language.template / name, staging / name)
    try:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=staging, capture_output=True, text=True,
            timeout=INSTALL_TIMEOUT, check=False,
        )
    except subprocess.TimeoutExpired:
        raise RunnerError(f"npm ci did not finish in {INSTALL_TIMEOUT:g} s") from None
    if done.returncode != 0 or not (staging / language.runner_entry).is_file():
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
