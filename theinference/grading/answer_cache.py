"""The oracle's answers, computed once per weights file and reused: in memory for a watch
session, on disk across processes.

A key is the weights' sha256, the oracle's version, the check and its exact arguments, so a
changed oracle, case or checkpoint can never be served a stale answer. Each file on disk starts
with an HMAC-SHA256 of its key and contents under a secret kept in the cache (mode 0600): a file
written or swapped by anything without the secret is a miss, recomputed and rewritten, never an
answer. The student's process never sees the secret when sandboxed (bwrap: the cache is not in
its filesystem; as nobody: the file is root's). Where it runs as the grader's own user it could
read the secret, so such a run neither reads nor writes the disk cache (answers live in memory
only: session.py) and the secret is replaced when the run ends (`rotate_secret`), so whatever
that process signed is a miss from then on (docs/grading-untrusted.md). Files
are written under a temporary name and renamed into place; a cache that cannot be written
(full disk, read-only) is switched off for the run with a note, never an error.
"""

import hashlib
import hmac
import io
import json
import os
import secrets
import threading
import time
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from theinference.atomic import atomic_file, atomic_write
from theinference.oracle.gpt2 import LayerKV

ORACLE_VERSION = 3  # bump whenever an answer, a noise floor or a bug's variant would change
MEMORY_ENTRIES = 64
MEMORY_BYTES = 1 << 30  # a long prompt's K/V is 75 MB: the answers held in memory, at most
DISK_MB_VAR = "THEINFERENCE_ANSWER_CACHE_MB"  # the answers kept on disk, at most (least
DISK_MB = 2048  # recently used first out); per weights file
KEY_FILE = "answer-key"
MAC_BYTES = 32


class AnswerCache:
    def __init__(self, weights_sha256: str, directory: Path | None):
        self.weights_sha256 = weights_sha256
        self.directory = directory / "answers" / weights_sha256[:16] if directory else None
        self._memory: OrderedDict[str, object] = OrderedDict()
        self._disk_bytes: int | None = None  # what the directory holds, once counted
        self._lock = threading.RLock()
        self.notes: list[str] = []
        self.rejected = 0  # files on disk whose MAC did not hold: forged, swapped or damaged
        self._secret = self._open_secret(directory) if directory else None

    def key(self, check: str, args: list) -> str:
        text = json.dumps([ORACLE_VERSION, self.weights_sha256, check, args])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get_or_compute(self, check: str, args: list, compute):
        with self._lock:  # a stage's long cases ask from threads (grading/beside.py)
            return self._get_or_compute(check, args, compute)

    def _get_or_compute(self, check: str, args: list, compute):
        key = self.key(check, args)
        if key in self._memory:
            self._memory.move_to_end(key)
            return self._memory[key]
        value = self._load(key)
        if value is None:
            value = compute()
            self._store(key, value)
        self._remember(key, value)
        return value

    def _remember(self, key: str, value) -> None:
        self._memory[key] = value
        while len(self._memory) > 1 and (
            len(self._memory) > MEMORY_ENTRIES
            or sum(nbytes(v) for v in self._memory.values()) > MEMORY_BYTES
        ):
            self._memory.popitem(last=False)

    def _open_secret(self, root: Path) -> bytes | None:
        try:
            return read_or_make_secret(root / KEY_FILE)
        except OSError as exc:
            self._switch_off(exc)
            return None

    def _mac(self, key: str, payload) -> bytes:
        mac = hmac.new(self._secret, key.encode() + b"\0", hashlib.sha256)
        mac.update(payload)  # (not joined to the key first: a copy of the answer)
        return mac.digest()

    def _load(self, key: str):
        if self.directory is None:
            return None
        path = self.directory / f"{key}.answer"
        try:
            blob = path.read_bytes()
            now = time.time_ns()  # used now: the last to be evicted (the clock, not the
            os.utime(path, ns=(now, now))  # file system's coarse one)
        except OSError:
            return None  # absent or unreadable: a miss
        # the bytes checked are the bytes read, never copied: a long prompt's K/V are 150 MB,
        # and every page first touched at a save costs (docs/development.md)
        with memoryview(blob) as view, view[MAC_BYTES:] as payload:
            signed = hmac.compare_digest(blob[:MAC_BYTES], self._mac(key, payload))
        if not signed:
            self.rejected += 1  # not written by a grader holding the secret: recompute
            return None
        stream = io.BytesIO(blob)  # (shares the bytes)
        stream.seek(MAC_BYTES)  # the archive after the signature: np.load reads from here
        try:
            with np.load(stream, allow_pickle=False) as data:
                return unpack({name: data[name] for name in data.files})
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
            return None

    def _store(self, key: str, value) -> None:
        if self.directory is None:
            return
        buffer = io.BytesIO()
        np.savez(buffer, **pack(value))
        payload = buffer.getvalue()
        try:
            atomic_write(self.directory / f"{key}.answer", self._mac(key, payload) + payload)
        except OSError as exc:
            self._switch_off(exc)
            return
        self._disk_bytes = (self._disk_bytes or 0) + len(payload) + MAC_BYTES
        if self._disk_bytes > disk_limit() or self._disk_bytes == len(payload) + MAC_BYTES:
            self._disk_bytes = evict(self.directory, disk_limit())

    def _switch_off(self, exc: OSError) -> None:
        self.notes.append(
            f"oracle cache off for this run ({exc.strerror or exc}): "
            "answers are recomputed, results are unaffected"
        )
        self.directory = None


def nbytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    return sum(kv.k.nbytes + kv.v.nbytes for kv in value) if isinstance(value, list) else 0


def disk_limit() -> int:
    """The bytes of answers kept on disk per weights file ($THEINFERENCE_ANSWER_CACHE_MB)."""
    try:
        return max(int(os.environ.get(DISK_MB_VAR, DISK_MB)), 0) << 20
    except ValueError:
        return DISK_MB << 20


def evict(directory: Path, limit: int) -> int:
    """Remove the least recently used answers until the folder holds at most `limit` bytes
    (a concurrent grader's removal is its own); what it holds then."""
    files = []
    for path in directory.glob("*.answer"):
        try:
            info = path.stat()
        except OSError:
            continue
        files.append((info.st_mtime_ns, info.st_size, path))
    held = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if held <= limit:
            break
        try:
            path.unlink()
        except OSError:
            continue
        held -= size
    return held


def read_or_make_secret(path: Path) -> bytes:
    """The cache's MAC secret: made once (first writer wins), readable by its owner only."""
    try:
        secret = path.read_bytes()
        if len(secret) == 32:
            return secret
    except FileNotFoundError:
        pass
    damaged = path.exists()  # a secret of the wrong size is replaced; an absent one, made once
    with atomic_file(path, 0o600, first_wins=not damaged) as tmp:
        tmp.write_bytes(secrets.token_bytes(32))
    return path.read_bytes()


def rotate_secret(root: Path) -> bool:
    """A new secret for the cache under `root`: every answer signed with the old one (which a
    process running as this user may have read) is recomputed from now on. Best effort."""
    try:
        with atomic_file(root / KEY_FILE, 0o600) as tmp:
            tmp.write_bytes(secrets.token_bytes(32))
    except OSError:
        return False
    return True


def pack(value) -> dict[str, np.ndarray]:
    if isinstance(value, np.ndarray):
        return {"array": value}
    if isinstance(value, list) and all(isinstance(v, LayerKV) for v in value):
        return {f"{kind}{i}": getattr(kv, kind) for i, kv in enumerate(value) for kind in "kv"}
    raise TypeError(f"cannot cache {type(value).__name__}")


def unpack(data: dict[str, np.ndarray]):
    if "array" in data:
        return data["array"]
    layers = len(data) // 2
    return [LayerKV(k=data[f"k{i}"], v=data[f"v{i}"]) for i in range(layers)]
