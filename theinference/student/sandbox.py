"""Where the student's process runs: inside bubblewrap, as an unprivileged user, or as we are.

`bwrap` gives the process its own user, PID, IPC, UTS and network namespaces and a filesystem
made only of read-only system and Python directories, the course (read-only, at /course), the
weights (read-only, at /weights/model.safetensors) and a private /tmp and HOME: it cannot see
the grader's processes, its cache, other courses, the host's /tmp or any network.
Without bubblewrap a grader running as root drops the student's process to a fresh uid of its
own (`unprivileged-user`, identity.py); otherwise it runs as the grader's own user (`none`),
which protects nothing on the filesystem. Containment of its processes and memory holds in
every mode (reaper.py, watchdog.py).
"""

import ctypes
import functools
import os
import shutil
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

from theinference.student.bwrap_probe import (
    NAMESPACES,
    TMPFS_BYTES,
    bwrap_problem,
    bwrap_sizes_tmpfs,
)

MODES = ("auto", "bwrap", "unprivileged-user", "none")
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
COURSE_MOUNT = "/course"
WEIGHTS_MOUNT = "/weights/model.safetensors"
WORKER_DIR = Path(__file__).parent / "worker"  # the worker's folder: Python's and Node's
WORKER_MOUNT = "/grader/worker"  # where the sandbox binds it, whole and read-only
HOME_MOUNT = "/home/student"
RUN_TOKEN_VAR = "THEINFERENCE_RUN_TOKEN"  # in every student process's environment (reaper.py)
PRIVATE_TMPFS = ("/tmp", HOME_MOUNT, "/dev/shm")  # the student's own writable folders
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")
PASSED_ENV = ("LANG", "LC_ALL")
PASSED_PREFIXES = ("OMP_", "OPENBLAS_", "MKL_", "NVPL_", "BLIS_", "GOTO_")  # BLAS tuning
# one BLAS thread unless the grader's environment says otherwise: idle OpenBLAS/MKL threads
# spin, so on a busy machine a multithreaded one-row product costs several times the CPU (and
# wall) of the work itself, and the student's CPU time is what the cost checks measure.
# OMP_NUM_THREADS is left alone: the TypeScript kernel's threads sleep when idle.
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# the student's arrays up to 32 MiB (glibc's most) kept in its heap, and freed heap kept: by
# default a fresh process maps and unmaps its large arrays, and a cache grown by concatenation
# at every step faults in new pages at every step (400,000 faults where this makes 2,000), which
# a sandbox makes slow, so that the student's code cost more in the grader than on its own
KEPT_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}
PR_SET_DUMPABLE = 4


class SandboxError(Exception):
    """The requested sandbox cannot be had; the message says why and what to do."""


@dataclass(frozen=True)
class Traits:
    """What a sandbox kind is, for every part of the grader that depends on it: the kind is
    told apart by these, never by its name outside this module and placement.py (which wraps
    the command)."""

    strength: int  # what it enforces, in order: none 0, unprivileged-user 1, bwrap 2
    own_user: bool  # the student's process runs as the grader's own user: it could read the
    # grader's answer cache and keys, and leave a cgroup the grader puts it in
    install_writer: str  # who could write the grader's installation: nobody | others | own user
    wrapper: str | None  # the process between the grader and the worker, if any ("bwrap"),
    # which reports a child killed by signal N as exit code 128 + N


TRAITS = {
    "none": Traits(0, own_user=True, install_writer="own user", wrapper=None),
    "unprivileged-user": Traits(1, own_user=False, install_writer="others", wrapper=None),
    "bwrap": Traits(2, own_user=False, install_writer="nobody", wrapper="bwrap"),
}


@dataclass
class Sandbox:
    """How student processes of one run are started. kind: bwrap | unprivileged-user | none."""

    kind: str
    notes: list[str] = field(default_factory=list)  # said once per run, e.g. how to do better

    @property
    def traits(self) -> Traits:
        return TRAITS[self.kind]

    def signal_from_exit(self, code: int) -> int:
        """The signal that killed the worker, as its wrapper's exit code says (0: none, or no
        wrapper)."""
        return signal_from_exit(code) if self.traits.wrapper else 0


def choose(mode: str) -> Sandbox:
    """The sandbox for `--sandbox MODE`: `none` leaves bubblewrap out, `auto` takes the
    strongest this machine allows, `unprivileged-user` and `bwrap` are minimums (the strongest
    available, refused below them). A root grader never runs the student as root when it can
    drop to a uid of the student's own."""
    if mode not in MODES:
        raise SandboxError(f"unknown sandbox '{mode}': choose one of {', '.join(MODES)}")
    notes = []
    if mode != "none":
        problem = bwrap_problem()
        if not problem:
            return Sandbox("bwrap")
        if mode == "bwrap":
            raise SandboxError(f"--sandbox bwrap: {problem}; {INSTALL_HINT}, or grade elsewhere")
        notes.append(f"no sandbox: {problem}; to isolate the student's code, {INSTALL_HINT}")
    chosen = without_bwrap(notes)
    if mode == "unprivileged-user" and chosen.kind == "none":
        why = chosen.notes[-1] if os.geteuid() == 0 else "only a grader running as root can drop"
        raise SandboxError(f"--sandbox unprivileged-user: {why}; {INSTALL_HINT}")
    return chosen


def without_bwrap(notes: list[str]) -> Sandbox:
    """A fresh unprivileged uid when the grader is root and the Python installation is
    readable by others (the course is copied where it is not); else the grader's own user."""
    if os.geteuid() != 0:
        return Sandbox("none", notes)
    unreadable = [p for p in python_roots() if not readable_by_others(p)]
    if not unreadable:
        return Sandbox("unprivileged-user", notes)
    notes.append(
        f"the student's process runs as root: {unreadable[0]} (the Python installation) is "
        "not readable by others, so it cannot run as an unprivileged user"
    )
    return Sandbox("none", notes)


# --- bubblewrap ------------------------------------------------------------------------------


def bwrap_command(inner: list[str], course: Path, weights: Path, hidden: list[Path]) -> list[str]:
    """bwrap's argv around `inner` (whose paths already name the mounts above). `hidden`:
    grader directories that must not show even if they sit below a bound directory."""
    args = [shutil.which("bwrap") or "bwrap", *NAMESPACES, "--die-with-parent"]
    args += ["--uid", "65534", "--gid", "65534"]  # no capabilities, not root even inside
    # the private /tmp and HOME first: a Python environment that lives under /tmp (a venv in a
    # temporary clone) is then bound on top of it instead of hidden by it
    args += ["--proc", "/proc", "--dev", "/dev"]
    for folder in PRIVATE_TMPFS:  # sized where bwrap can (0.8+): their files live in memory
        args += [*(["--size", str(TMPFS_BYTES)] if bwrap_sizes_tmpfs() else []), "--tmpfs", folder]
    args += _system_binds() + _python_binds()
    args += ["--ro-bind", str(course), COURSE_MOUNT]
    args += ["--ro-bind-try", str(weights), WEIGHTS_MOUNT]
    args += ["--ro-bind", str(WORKER_DIR), WORKER_MOUNT]
    for path in filter(Path.is_dir, hidden):  # a tmpfs over it where it would show
        if any(_below(path, root) for root in python_roots()):
            args += ["--tmpfs", str(path)]
        if _below(path, course):
            args += ["--tmpfs", str(Path(COURSE_MOUNT) / path.relative_to(course))]
    return [*args, "--chdir", COURSE_MOUNT, "--", *inner]


SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def bwrap_env(token_var: str, token: str) -> dict[str, str]:
    """The whole environment inside bubblewrap."""
    return student_env((token_var, token), HOME_MOUNT, "/tmp", WEIGHTS_MOUNT, SYSTEM_PATH)


def student_env(
    token: tuple[str, str], home: str, tmpdir: str, weights: str, path: str
) -> dict[str, str]:
    """The student's whole environment, in every mode: nothing of the grader's beyond locale
    and BLAS tuning (one thread unless that tuning says otherwise; not its cache's path, its
    seed, or anything a grader's CI keeps there), and its heap kept (KEPT_HEAP)."""
    env = {k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith(PASSED_PREFIXES)}
    return {
        **ONE_BLAS_THREAD,
        **KEPT_HEAP,
        **env,
        "PATH": path,
        "HOME": home,
        "USER": "student",
        "TMPDIR": tmpdir,
        "THEINFERENCE_WEIGHTS": weights,
        "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ writes in the course directory
        token[0]: token[1],  # lets the grader find and kill anything that escaped the tree
    }


def _system_binds() -> list[str]:
    args = []
    for name in SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _python_binds() -> list[str]:
    args = []
    for root in python_roots():
        args += ["--ro-bind", str(root), str(root)]
    return args


@functools.cache
def python_roots() -> tuple[Path, ...]:
    """The interpreter and the environment it imports from (venv and base installation),
    outside the system directories that are bound anyway; parents absorb their children."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    candidates |= set(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        candidates.add(site.getusersitepackages())
    candidates.add(os.path.dirname(os.path.realpath(sys.executable)))
    roots = set()
    for item in candidates:
        for path in {Path(item), Path(os.path.realpath(item))}:
            if path.is_dir() and not any(_below(path, Path("/") / d) for d in SYSTEM_DIRS):
                roots.add(path)
    return tuple(sorted(r for r in roots if not any(r != o and _below(r, o) for o in roots)))


def _below(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def signal_from_exit(code: int) -> int:
    """bwrap reports a child killed by signal N as exit code 128 + N; 0 when not that."""
    return code - 128 if 128 < code < 128 + 65 else 0


# --- an unprivileged user, for a root grader without bubblewrap (identity.py) -----------


def readable_by_others(path: Path) -> bool:
    """Every ancestor searchable by others and the directory itself listable: what a process
    running as an unprivileged uid needs to import from it."""
    path = path.resolve()
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        if not mode & 0o001:
            return False
    return bool(path.stat().st_mode & 0o004)


def hide_grader_environ() -> None:
    """Make this process non-dumpable: /proc/<grader>/environ (the seed, the cache's path)
    is then unreadable to other processes without CAP_SYS_PTRACE, same user included."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: nothing to hide this way
