"""Where, and as whom, the student's process runs, per sandbox kind: its command, environment,
user and working folder (Popen's arguments); what its files hold in memory-backed folders; and
what is removed when its runs are over.

- bwrap: bubblewrap around the worker (sandbox.py), with the course and weights bound in.
- unprivileged-user: a fresh uid of its own (identity.py), its private folder, the worker
  scripts and, where others cannot read the course, the course copied where the uid can.
- none: the grader's own user; still a clean environment (sandbox.student_env).
"""

import os
import shutil
from pathlib import Path

from theinference.course.languages import Language
from theinference.oracle.weights import cache_dir
from theinference.student import holdings, identity, launch, sandbox


class Placement:
    """How one run's worker is started in its sandbox: the sandbox's own command module (with
    sandbox.py, the one place a sandbox kind is told by its name)."""

    def __init__(
        self,
        box: sandbox.Sandbox,
        course_dir: Path,
        weights: Path,
        token: tuple[str, str],
        language: Language,
        extra_env: dict[str, str] | None = None,
    ):
        self.kind = box.kind  # bwrap | unprivileged-user | none
        self.course_dir = course_dir
        self.language = language  # which worker
        self.weights = weights
        self.token = token  # (variable, value): inherited by every descendant
        self.extra_env = dict(extra_env or {})  # the grader's own settings, e.g. BLAS threads
        self.uid: int | None = None  # unprivileged-user: the uid of the student's own
        self.run_dir: Path | None = None  # unprivileged-user: HOME, weights, worker, course

    def command(
        self, fds: list[str], memory: str, mode: str = "adapters"
    ) -> tuple[list[str], dict, dict, Path]:
        """argv, environment, the user to run as and the folder to work in; `mode` as
        launch.worker_argv's."""
        language = self.language
        if self.kind == "bwrap":
            command = launch.in_bwrap(self.course_dir, self.weights, fds, memory, language, mode)
            return command, self.env(sandbox.bwrap_env(*self.token)), {}, self.course_dir
        sandbox.hide_grader_environ()
        if self.kind != "unprivileged-user":
            home, tmp = os.environ.get("HOME", "/"), os.environ.get("TMPDIR", "/tmp")
            path = os.environ.get("PATH", sandbox.SYSTEM_PATH)
            env = self.env(sandbox.student_env(self.token, home, tmp, str(self.weights), path))
            argv = launch.worker_argv(self.course_dir, fds, memory, language, mode=mode)
            return argv, env, {}, self.course_dir
        run_dir, course = self.private_world()
        home = str(run_dir / "home")
        weights = str(run_dir / "model.safetensors")
        env = self.env(sandbox.student_env(self.token, home, home, weights, sandbox.SYSTEM_PATH))
        as_user = {"user": self.uid, "group": self.uid, "extra_groups": []}  # root is given up
        workers = run_dir / "worker"  # a copy it can read, wherever the grader is installed
        argv = launch.worker_argv(course, fds, memory, language, workers, mode)
        return argv, env, as_user, course

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The student's environment with the grader's extra settings (the token kept)."""
        return {**base, **self.extra_env, self.token[0]: self.token[1]}

    def private_world(self) -> tuple[Path, Path]:
        """unprivileged-user: a fresh uid, its private directory, and the course as it reads
        it (a read-only copy when the course itself is not readable by others, made once per
        run: what is graded is what was there when the run began)."""
        if self.run_dir is None:
            self.uid, gid = identity.fresh_ids()
            self.run_dir = identity.private_run_dir(self.weights, self.uid, gid)
            identity.readable_worker(launch.WORKER_DIR, self.run_dir / "worker")
        course = self.course_dir
        if not sandbox.readable_by_others(course):
            course = self.run_dir / "course"
            if not course.is_dir():
                identity.readable_copy(self.course_dir, self.run_dir, [cache_dir()])
        return self.run_dir, course

    def file_bytes(self, worker: int) -> int:
        """What the student's files hold in memory-backed folders (see holdings.py)."""
        if self.kind == "bwrap":
            return holdings.sandbox_bytes(worker, sandbox.PRIVATE_TMPFS)
        if self.uid is not None:
            return holdings.owned_bytes(self.uid, holdings.shared_folders())
        return 0  # as the grader's own user: its files cannot be told from the grader's

    def close(self) -> None:
        """Remove the private folder, and what the uid left in the host's shared folders."""
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None
        if self.uid is not None:
            holdings.remove_owned(self.uid, holdings.writable_folders())
