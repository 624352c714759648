"""The checkpoint in the grader's own memory: read whole, hashed as read, and held read-only, so
what the oracle computes on is exactly what was checked.

A run whose answers all come from the answer cache never computes, so it never needs the
tensors: they are read on first use (`PrivateTensors`), and checked then against the sha256 the
run was keyed by. A file changed in between is an error, never an answer over other weights.
"""

import hashlib
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from theinference.oracle.checkpoint import WeightsError
from theinference.oracle.safetensors_io import SafetensorsError, tensors_in

StatKey = tuple  # (resolved path, device, inode, size, mtime_ns, ctime_ns)


class DigestMemo(Protocol):
    """sha256s of files read before, by their StatKey. A write moves a file's ctime, which
    os.utime cannot put back, so a key still matching says the bytes are the ones hashed; only a
    memo the student's process can neither read nor write may be given (grading/digests.py)."""

    def known(self, key: StatKey) -> str | None: ...

    def learn(self, key: StatKey, sha256: str) -> None: ...


def stat_key(path: Path) -> StatKey:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_private(path: Path, memo: DigestMemo | None = None) -> tuple[np.ndarray, str]:
    """The whole file read into this process's own memory ([size] uint8, read-only), and the
    sha256 of exactly those bytes. The last file read is kept in memory while its StatKey holds,
    so a process loading it again (tests, verify) does not pay twice; `memo` learns the digest
    of a file nothing wrote to while it was read."""
    key = stat_key(path)
    if key in _LAST_READ:
        return _LAST_READ[key]
    buffer = np.empty(key[3], dtype=np.uint8)
    view, h, done = memoryview(buffer), hashlib.sha256(), 0
    with path.open("rb", buffering=0) as f:
        while done < buffer.size:
            got = f.readinto(view[done : done + (1 << 24)])
            if not got:
                raise OSError(f"{path} shrank while it was read")
            h.update(view[done : done + got])
            done += got
    buffer.flags.writeable = False
    if stat_key(path) == key:  # nothing wrote to it while it was read
        _LAST_READ.clear()
        _LAST_READ[key] = (buffer, h.hexdigest())
        if memo is not None:
            memo.learn(key, h.hexdigest())
    return buffer, h.hexdigest()


_LAST_READ: dict[StatKey, tuple[np.ndarray, str]] = {}


class PrivateTensors(Mapping):
    """name -> tensor ([...] float32 views of the private copy). Given the tensors, they are
    these; given none, the file is read on first use and must hash to `sha256`."""

    def __init__(self, path: Path, sha256: str, tensors: dict[str, np.ndarray] | None = None):
        self._path, self._sha256, self._tensors = path, sha256, tensors
        self._lock = threading.Lock()  # a stage's cases and its planner ask from threads

    @property
    def read(self) -> bool:
        return self._tensors is not None

    def _held(self) -> dict[str, np.ndarray]:
        if self._tensors is None:
            with self._lock:
                if self._tensors is None:
                    self._tensors = self._read_checked()
        return self._tensors

    def _read_checked(self) -> dict[str, np.ndarray]:
        try:
            buffer, digest = read_private(self._path)
            tensors = tensors_in(buffer, self._path)
        except (OSError, SafetensorsError) as exc:
            raise WeightsError(f"cannot read the weights {self._path}: {exc}") from None
        if digest != self._sha256:
            raise WeightsError(
                f"{self._path} changed since the run began (sha256 {digest[:12]}, not "
                f"{self._sha256[:12]}): nothing was graded over it; run again"
            )
        return tensors

    def __getitem__(self, name: str) -> np.ndarray:
        return self._held()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held())

    def __len__(self) -> int:
        return len(self._held())
