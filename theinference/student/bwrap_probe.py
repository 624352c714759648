"""Whether this machine's bubblewrap can sandbox the student's process, probed once per grader
process: it is installed but fails in containers that forbid user namespaces, and only 0.8 and
later size a tmpfs. Each probe's PID 1 is reaped (sandbox.py builds the real command)."""

import functools
import json
import os
import shutil
import subprocess

from theinference.student import reaper

TMPFS_BYTES = 256 << 20  # each: room for a student's scratch files, bounded in memory
NAMESPACES = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-net",
    "--unshare-uts",
    "--unshare-cgroup-try",
)


@functools.cache
def bwrap_problem() -> str:
    """Why bubblewrap cannot be used here ("" when it can): probed once per process, since it
    is installed but fails in containers that forbid user namespaces."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bubblewrap (bwrap) is not installed"
    probe = ["--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    try:
        done = bwrap_ran(binary, probe)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap does not start ({exc})"
    if done.returncode != 0:
        reason = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        return f"bwrap cannot make its namespaces here ({reason})"
    return ""


@functools.cache
def bwrap_sizes_tmpfs() -> bool:
    """Whether this bubblewrap can size a tmpfs (`--size`, 0.8 and later)."""
    probe = ["--ro-bind", "/", "/", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp", "true"]
    try:
        return bwrap_ran(shutil.which("bwrap") or "bwrap", probe).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def bwrap_ran(binary: str, args: list[str]) -> subprocess.CompletedProcess:
    """A probe of bubblewrap in its namespaces, run to its end. Its PID 1 (bwrap's inner
    process, named by --info-fd) comes to the grader once the outer one ends when the grader
    is a subreaper (reaper.py), and is reaped here: else a zombie until the grader exits."""
    info_read, info_write = os.pipe()
    with os.fdopen(info_read, "rb") as info:
        try:
            argv = [binary, "--info-fd", str(info_write), *NAMESPACES, *args]
            done = subprocess.run(argv, capture_output=True, timeout=30, pass_fds=(info_write,))
        finally:
            os.close(info_write)
        inner = child_pid(info.read())  # all of it: bwrap, its only other writer, has ended
    if inner is not None:
        reaper.reap_all({inner})
    return done


def child_pid(info: bytes) -> int | None:
    """The "child-pid" of bwrap's --info-fd JSON, if it wrote one."""
    try:
        pid = json.loads(info).get("child-pid")
    except (ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None
