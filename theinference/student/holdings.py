"""Memory the student's process holds in files: a file in a tmpfs lives in memory whether or
not anything maps it, so the memory cap counts it. Under bwrap those folders are the
sandbox's own (sized tmpfs mounts, seen from outside through /proc/<pid>/root); for a dropped
uid, its files in the host's memory-backed folders that everyone may write (/dev/shm, and /tmp
where it is a tmpfs), which are also removed when its process stops.
"""

import os
import shutil
from pathlib import Path

SHARED_FOLDERS = ("/dev/shm", "/tmp", "/var/tmp", "/run/shm", "/run/lock")
WALK_LIMIT = 20_000  # entries looked at per count: a million empty files cost time, not memory


def tmpfs_mounts() -> set[str]:
    """Mount points of memory-backed filesystems (tmpfs, ramfs) seen by this process."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return set()
    fields = [line.split() for line in lines]
    return {f[1] for f in fields if len(f) > 2 and f[2] in ("tmpfs", "ramfs")}


def sandbox_bytes(worker: int, folders: tuple[str, ...]) -> int:
    """Bytes in use in each of the sandbox's own tmpfs `folders`, read through the worker's
    root (0 where that cannot be seen: the grader without the right to look)."""
    total = 0
    for folder in folders:
        try:
            st = os.statvfs(f"/proc/{worker}/root{folder}")
        except OSError:
            continue
        total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total


def shared_folders() -> list[Path]:
    """The folders others may write in that hold their files in memory, on this machine."""
    mounts = tmpfs_mounts()
    return [Path(f) for f in SHARED_FOLDERS if os.path.isdir(f) and on_tmpfs(f, mounts)]


def writable_folders() -> list[Path]:
    """Every folder of SHARED_FOLDERS on this machine, memory-backed or not: where a uid's
    leftovers are removed when its process stops."""
    return [Path(f) for f in SHARED_FOLDERS if os.path.isdir(f)]


def on_tmpfs(path: str, mounts: set[str]) -> bool:
    """Whether `path` lies on one of `mounts` (its nearest mount point is one)."""
    real = Path(os.path.realpath(path))
    nearest = next((p for p in [real, *real.parents] if os.path.ismount(p)), Path("/"))
    return str(nearest) in mounts


def owned_bytes(uid: int, roots: list[Path]) -> int:
    """Bytes of the files owned by `uid` below `roots` (their blocks: a sparse file counts
    what it really holds)."""
    total, looked = 0, 0
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                looked += 1
                try:
                    st = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue
                if st.st_uid == uid and not os.path.isdir(os.path.join(folder, name)):
                    total += st.st_blocks * 512
            if looked > WALK_LIMIT:
                return total
    return total


def remove_owned(uid: int, roots: list[Path]) -> None:
    """Remove what `uid` left directly in `roots` (files and folders it owns)."""
    for root in roots:
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
