"""The command that starts the student's process, per the runtime of the course's language (the
Python worker, or the Node worker under the course's own tsx; both in student/worker/, which the
sandbox binds whole), and the environment it starts in."""

import functools
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from theinference.course import languages
from theinference.course.languages import Language
from theinference.oracle.weights import cache_dir
from theinference.student import sandbox
from theinference.student.sandbox import WORKER_DIR
from theinference.student.worker.protocol import HOOKS


def worker_argv(
    course_dir: Path,
    fds: tuple[int | str, int | str],
    memory_bytes: int | str,
    language: Language = languages.DEFAULT,
    worker_dir: Path = WORKER_DIR,
    mode: str = "adapters",
) -> list[str]:
    """The command that starts the student's process for this course's language. fds: the
    request and reply pipes' descriptors; worker_dir: where the worker scripts are seen from
    inside the process (a sandbox mounts them); mode: adapters, measured (adapters, for a
    measured call: started without site processing, ISOLATION), guarded (measured, with
    starting a process forbidden: worker/guard.py), or calibrate (the grader's own matrix
    product, no student code loaded). Every worker is given the same six arguments: the two
    descriptors, the course, the memory limit, the mode, and the functions a hook may wrap,
    comma-separated and spelled as the course's language spells them (the Node worker
    prepares them as it starts; the Python worker wraps whatever a request names)."""
    request_fd, reply_fd = fds
    hooks = ",".join(language.spelled(hook) for hook in HOOKS)
    tail = [str(request_fd), str(reply_fd), str(course_dir), str(memory_bytes), mode, hooks]
    worker = str(worker_dir / language.worker)
    return RUNTIMES[language.runtime](language, worker, memory_bytes, mode) + tail


def python_argv(language: Language, worker: str, memory_bytes: int | str, mode: str) -> list:
    """The Python worker under this interpreter, kept from the user's site-packages as its
    mode asks (ISOLATION); where that is without site processing, the folders it imports from
    named on its command line (PATH_OPTION)."""
    flags = ISOLATION.get(mode, ["-P"])
    if "-S" in flags:
        flags = [*flags, "-X", f"{PATH_OPTION}={os.pathsep.join(worker_path())}"]
    return [sys.executable, *flags, worker]


PATH_OPTION = "theinference_path"  # -X option: the worker's folders to import from (worker.py)


@functools.cache
def worker_path() -> tuple[str, ...]:
    """The folders this grader imports packages from (its site-packages, and what their .pth
    files added when this grader started), for a worker started without site processing: the
    same packages, and not one .pth file run. Not the standard library's (-S keeps them), the
    user site (-I leaves it out), the folder the grader was started from, nor the grader's own
    source folder where it is not a site-packages (the student's process imports nothing of
    the grader)."""
    stdlib = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib")}
    sites = set(site.getsitepackages())
    source = str(Path(__file__).resolve().parents[2])  # the folder the package is in
    left_out = {"", os.getcwd(), sys.path[0], site.getusersitepackages()}
    left_out |= set() if source in sites else {source}
    found = []
    for entry in sys.path[1:]:
        below_stdlib = any(entry == s or entry.startswith(s + os.sep) for s in stdlib)
        if entry in left_out or entry in found or (below_stdlib and entry not in sites):
            continue
        if os.path.isdir(entry):
            found.append(entry)
    return tuple(found)


def node_argv(language: Language, worker: str, memory_bytes: int | str, mode: str) -> list:
    """The Node worker under the course's own tsx, its heap within the memory limit."""
    heap_mb = max(int(memory_bytes) // 2**20, 256)
    return [
        node_path(),
        f"--max-old-space-size={heap_mb}",
        *kernel_flags(language.template / FUSED_KERNEL),
        "--import",
        "tsx",  # resolved from the course directory (the working directory): its node_modules
        worker,
    ]


RUNTIMES = {"python": python_argv, "node": node_argv}  # a language's runtime -> its command


# The calibration and a measured call's worker (guarded: starting a process forbidden; or
# measured, in its cgroup) run nothing the student's code could have left for them: -I, no
# user site-packages (a usercustomize.py left in HOME would run before the worker's first
# line: in a guarded worker, before its filter); -S, no site processing at all (a .pth file
# left in the grader's site-packages runs even under -I: it could slow the calibration, or
# start a helper before the filter), the folders named instead (worker_path); -B keeps the
# course free of __pycache__ where -I ignores PYTHONDONTWRITEBYTECODE
ISOLATION = {mode: ["-I", "-S", "-B"] for mode in ("calibrate", "guarded", "measured")}

# Relaxed SIMD (the course's kernel-fma.wasm) is behind this flag in Node 20, on by default from
# 21 (where the flag may be gone: passing an unknown one stops Node)
RELAXED_SIMD_FLAG = "--experimental-wasm-relaxed-simd"
FUSED_KERNEL = Path("src/kernel-fma.wasm")  # in the template
VALIDATES = (
    "process.exit(WebAssembly.validate(require('fs').readFileSync(process.argv[1])) ? 0 : 1)"
)


def node_path() -> str:
    return shutil.which("node") or "node"


@functools.cache
def kernel_flags(fused_kernel: Path) -> tuple[str, ...]:
    """Node's flags for the course's kernel: none where this Node runs the fused kernel as it
    is, the relaxed SIMD flag where it runs it only with it (asked of Node once, not guessed from
    its version), none where it cannot (kernel.ts then uses the plain kernel)."""
    for flags in ((), (RELAXED_SIMD_FLAG,)):
        try:
            done = subprocess.run([node_path(), *flags, "-e", VALIDATES, str(fused_kernel)],
                                  capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return ()
        if done.returncode == 0:
            return flags
    return ()


def in_bwrap(
    course: Path, weights: Path, fds: list[str], memory: str, language: Language, mode: str
) -> list:
    """The worker's command inside bubblewrap: the course, the weights and the worker's folder
    mounted, the grader's cache and package hidden."""
    mounts = Path(sandbox.WORKER_MOUNT)
    inner = worker_argv(Path(sandbox.COURSE_MOUNT), fds, memory, language, mounts, mode)
    hidden = [cache_dir().resolve(), Path(__file__).parents[1]]
    return sandbox.bwrap_command(inner, course, weights, hidden)
