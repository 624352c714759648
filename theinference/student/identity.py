"""A fresh unprivileged identity for each student process, where the grader is root and
bubblewrap cannot run: a uid and gid of its own, from a range no account uses, never `nobody`
(which every submission would share). A process left behind by one submission then can neither
signal, ptrace nor read another's worker, and everything running as that uid is killed with it.

Its world is a private directory (0711, root's) holding its HOME (owned by the uid), the
weights as a read-only link or copy, and, when the course itself is not readable by others, a
read-only copy of the course.
"""

import grp
import os
import pwd
import random
import shutil
import tempfile
from pathlib import Path

from theinference.course import languages

# the worker scripts of every language, by their suffix (each with the modules it imports),
# and the protocol they read (worker/protocol.json)
WORKER_SUFFIXES = {Path(language.worker).suffix for language in languages.ALL} | {".json"}

PREFERRED = (1_800_000_000, 1_900_000_000)  # far above any account or container mapping base
LOW = (200_000, 1_000_000)  # where a user namespace maps less than the preferred range
COURSE_SKIP = (".git", ".theinference", "__pycache__")  # the grader's, or nothing to read


def fresh_ids() -> tuple[int, int]:
    """A uid and gid that no account names and no process runs as, mapped in this user
    namespace (a container may map only part of the id space)."""
    taken = {e.pw_uid for e in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    taken |= running_uids()
    mapped = mapped_ranges("uid_map") and mapped_ranges("gid_map")
    for low, high in (PREFERRED, LOW, (60_000, 65_000)):
        for _ in range(64):
            candidate = random.randrange(low, high)
            if candidate not in taken and in_ranges(candidate, mapped):
                return candidate, candidate
    raise OSError("no free unprivileged uid is mapped in this user namespace")


def mapped_ranges(name: str) -> list[tuple[int, int]]:
    """The ids this namespace can use: (first, past the last) from /proc/self/{uid,gid}_map."""
    try:
        lines = Path(f"/proc/self/{name}").read_text().splitlines()
    except OSError:
        return [(0, 2**32 - 1)]
    return [(int(f[0]), int(f[0]) + int(f[2])) for f in map(str.split, lines) if len(f) == 3]


def in_ranges(value: int, ranges: list[tuple[int, int]]) -> bool:
    return any(low <= value < high for low, high in ranges)


def running_uids() -> set[int]:
    """The uids of every process now running (real ones, from /proc/<pid>/status)."""
    uids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = next(
                    ln for ln in (entry / "status").read_text().splitlines() if ln[:4] == "Uid:"
                )
                uids.add(int(line.split()[1]))
            except (OSError, StopIteration, ValueError, IndexError):
                continue
    return uids


def private_run_dir(weights: Path, uid: int, gid: int) -> Path:
    """A directory only root can list (0711) holding HOME (the uid's) and the weights as a
    read-only link or copy: the student's process never learns the cache's path."""
    run_dir = Path(tempfile.mkdtemp(prefix="theinference-run-"))
    run_dir.chmod(0o711)
    home = run_dir / "home"
    home.mkdir(mode=0o700)
    os.chown(home, uid, gid)
    target = run_dir / "model.safetensors"
    try:
        if weights.stat().st_mode & 0o004:
            os.link(weights, target)  # same inode, still root's and read-only to the uid
        else:
            raise OSError("not readable by others")
    except OSError:
        if weights.is_file():
            shutil.copyfile(weights, target)
            target.chmod(0o444)
    return run_dir


def readable_copy(course: Path, into: Path, hidden: list[Path]) -> Path:
    """A copy of the course others can read but not write (root's, 0755/0644), without the
    grader's own folders and without `hidden` ones (a cache kept inside the course)."""
    hidden = [p.resolve() for p in hidden]

    def skip(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in COURSE_SKIP or (Path(folder) / n).resolve() in hidden}

    target = into / "course"
    shutil.copytree(course, target, symlinks=True, ignore=skip)
    for folder, _dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):  # a program stays one (node_modules' esbuild)
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
    return target


def readable_worker(source: Path, target: Path) -> None:
    """The worker scripts, copied where the uid can read them (root's, read-only)."""
    target.mkdir(mode=0o755)
    for script in source.iterdir():
        if script.suffix in WORKER_SUFFIXES and script.name != "__init__.py":
            shutil.copyfile(script, target / script.name)
            (target / script.name).chmod(0o644)
