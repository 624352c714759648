"""The command that starts the student's process, per course language (the Python worker, or
the Node worker under the course's own tsx; both in student/worker/, which the sandbox binds
whole), and the environment it starts in."""

import shutil
import sys
from pathlib import Path

from theinference.course.languages import TYPESCRIPT, course_language
from theinference.oracle.weights import cache_dir
from theinference.student import sandbox
from theinference.student.sandbox import WORKER_DIR


def worker_argv(
    course_dir: Path,
    request_fd: int | str,
    reply_fd: int | str,
    memory_bytes: int | str,
    language: str | None = None,
    worker_dir: Path = WORKER_DIR,
    mode: str = "adapters",
) -> list[str]:
    """The command that starts the student's process for this course's language. worker_dir:
    where the worker scripts are seen from inside the process (a sandbox mounts them); mode:
    adapters, or calibrate (the grader's own matrix product, no student code loaded)."""
    language = language or course_language(course_dir)
    tail = [str(request_fd), str(reply_fd), str(course_dir), str(memory_bytes)]
    tail += [] if mode == "adapters" else [mode]
    if language != TYPESCRIPT:
        # -I for the calibration: no user site-packages either (a usercustomize.py the
        # student's process could leave in HOME)
        isolation = "-I" if mode == "calibrate" else "-P"
        return [sys.executable, isolation, str(worker_dir / "worker.py"), *tail]
    heap_mb = max(int(memory_bytes) // 2**20, 256)
    return [
        shutil.which("node") or "node",
        f"--max-old-space-size={heap_mb}",
        "--import",
        "tsx",  # resolved from the course directory (the working directory): its node_modules
        str(worker_dir / "worker_node.mjs"),
        *tail,
    ]


def in_bwrap(
    course: Path, weights: Path, fds: list[str], memory: str, language: str, mode: str
) -> list:
    """The worker's command inside bubblewrap: the course, the weights and the worker's folder
    mounted, the grader's cache and package hidden."""
    mounts = Path(sandbox.WORKER_MOUNT)
    inner = worker_argv(Path(sandbox.COURSE_MOUNT), *fds, memory, language, mounts, mode)
    hidden = [cache_dir().resolve(), Path(__file__).parents[1]]
    return sandbox.bwrap_command(inner, course, weights, hidden)
