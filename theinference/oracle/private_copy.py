"""The checkpoint in the grader's own memory: read, hashed as read, and held read-only, so what
the oracle computes on is exactly what was checked.

A run whose answers all come from the answer cache never computes, so it never needs the
tensors; a swap drawn per run on layer 0 needs a few. Where a memo (grading/digests.py) holds
the digest of each tensor's bytes, hashed when the whole file was last read and found to be the
file the run is keyed by, each tensor is read on first use and checked against its own digest
(`PrivateTensors`); the token embedding, of which a swap drawn per run embeds a few hundred
random rows, is read a row at a time, each checked against its row's digest (`rows`). A file
changed in between is an error, never an answer over other weights.
"""

import base64
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from theinference.oracle.checkpoint import WeightsError
from theinference.oracle.safetensors_io import (
    SafetensorsError,
    decode,
    header_in,
    read_header,
    tensors_in,
)

StatKey = tuple  # (resolved path, device, inode, size, mtime_ns, ctime_ns)
# {"sha256": the file's, "parts": {tensor name: its bytes' sha256}, "rows": {tensor name:
# base64 of ROW_DIGEST bytes of each row's sha256, row after row}}
Digests = dict
ROWS_ALONE = ("wte.weight",)  # tensors whose rows are read alone where their digests are known
ROW_DIGEST = 16  # bytes of a row's sha256 kept: 128 bits, still past any second preimage


class DigestMemo(Protocol):
    """Digests of files read before, by their StatKey. A write moves a file's ctime, which
    os.utime cannot put back, so a key still matching says the bytes are the ones hashed; only a
    memo the student's process can neither read nor write may be given."""

    def known(self, key: StatKey) -> Digests | None: ...

    def learn(self, key: StatKey, digests: Digests) -> None: ...


def stat_key(path: Path) -> StatKey:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class PrivateRead:
    buffer: np.ndarray  # [size] uint8, read-only: the whole file
    sha256: str
    key: StatKey | None  # the file's, where nothing wrote to it while it was read


def read_private(path: Path) -> PrivateRead:
    """The whole file read into this process's own memory, and the sha256 of exactly those
    bytes. The last file read is kept in memory while its StatKey holds, so a process loading
    it again (tests, verify) does not pay twice."""
    key = stat_key(path)
    if key in _LAST_READ:
        return _LAST_READ[key]
    buffer = read_range(path, 0, key[3])
    read = PrivateRead(buffer, hashlib.sha256(buffer).hexdigest(),
                       key if stat_key(path) == key else None)
    if read.key is not None:
        _LAST_READ.clear()
        _LAST_READ[key] = read
    return read


_LAST_READ: dict[StatKey, PrivateRead] = {}


def read_range(path: Path, begin: int, length: int) -> np.ndarray:
    """[length] uint8 of the file from `begin`, read-only; an OSError if it is shorter."""
    buffer = np.empty(length, dtype=np.uint8)
    view, done = memoryview(buffer), 0
    with path.open("rb", buffering=0) as f:
        f.seek(begin)
        while done < length:
            got = f.readinto(view[done : done + (1 << 24)])
            if not got:
                raise OSError(f"{path} shrank while it was read")
            done += got
    buffer.flags.writeable = False
    return buffer


def read_rows(path: Path, offsets: list[int], size: int) -> np.ndarray:
    """[len(offsets), size] uint8: `size` bytes of the file from each offset, read-only."""
    rows = np.empty((len(offsets), size), dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        for row, offset in zip(rows, offsets, strict=True):
            if os.preadv(fd, [row], offset) != size:
                raise OSError(f"{path} shrank while it was read")
    finally:
        os.close(fd)
    rows.flags.writeable = False
    return rows


def part_digests(tensors: dict[str, np.ndarray]) -> dict[str, str]:
    """Each tensor's bytes' sha256, as stored (tensors viewing a whole file's read)."""
    return {name: hashlib.sha256(t.view(np.uint8).reshape(-1)).hexdigest()
            for name, t in tensors.items() if t.flags.c_contiguous}


def row_digests(buffer: np.ndarray, path: Path) -> dict[str, str]:
    """The digests of each row of the ROWS_ALONE tensors, from the whole file's bytes read
    (`buffer`: the bytes as stored, whatever their dtype)."""
    header, start = header_in(buffer, path)
    found = {}
    for name in ROWS_ALONE:
        if name in header and header[name]["shape"]:
            begin, end = header[name]["data_offsets"]
            rows = buffer[start + begin : start + end].reshape(header[name]["shape"][0], -1)
            found[name] = base64.b64encode(b"".join(
                hashlib.sha256(row).digest()[:ROW_DIGEST] for row in rows)).decode()
    return found


class PrivateTensors(Mapping):
    """name -> tensor, the grader's own. Given `tensors`, they are these; given none, each is
    read on first use: alone where `parts` holds its digest, else with the whole file, which
    must hash to `sha256` (`read_whole` is then told, so a memo can learn the parts)."""

    def __init__(self, path: Path, sha256: str, tensors: dict[str, np.ndarray] | None = None,
                 parts: dict[str, str] | None = None,
                 read_whole: Callable[[PrivateRead, dict], None] | None = None,
                 rows: dict[str, str] | None = None):
        self._path, self.sha256, self._parts = path, sha256, parts or {}
        self._rows: dict = dict(rows or {})  # tensor name -> its rows' digests (row_digests)
        self._read_whole = read_whole  # told of a whole read and its tensors, once checked
        self._tensors: dict[str, np.ndarray] = dict(tensors or {})
        self._names = list(tensors) if tensors is not None else None
        self._header: tuple[dict, int] | None = None  # read once, when first needed
        self._lock = threading.Lock()  # a stage's cases and its planner ask from threads

    @property
    def read(self) -> bool:
        """Whether any tensor is held (a warm run that computes nothing holds none)."""
        return bool(self._tensors)

    def __getitem__(self, name: str) -> np.ndarray:
        held = self._tensors.get(name)
        if held is None:
            with self._lock:
                if name not in self._tensors:
                    self._tensors.update(self._read_checked(name))
                held = self._tensors[name]
        return held

    def rows(self, name: str, ids) -> np.ndarray:
        """self[name][ids]: where the tensor is not held and its rows' digests are known, the
        rows `ids` alone, each read and checked against its own digest."""
        digests = self._row_digests(name)
        if name in self._tensors or digests is None:
            return self[name][ids]
        count = len(digests) // ROW_DIGEST
        wanted = np.asarray(ids, dtype=np.int64).reshape(-1)
        if wanted.size and (wanted.min() < -count or wanted.max() >= count):
            raise IndexError(f"a row out of range for {name}, of {count} rows")
        wanted = wanted % count  # a negative row counts from the end, as NumPy's (a copy)
        # sorted and each once (not np.unique: it loads numpy.ma, 10 ms)
        unique = np.array(sorted(set(wanted.tolist())), dtype=np.int64)
        held = self._read_rows(name, unique, digests)
        return held[np.searchsorted(unique, wanted)].reshape(*np.shape(ids), held.shape[1])

    def _row_digests(self, name: str) -> bytes | None:
        """The digests of the tensor's rows, ROW_DIGEST bytes each, where the memo gave one
        for every row of a 2-D tensor the file holds; else None."""
        if name not in self._rows or name not in self._layout()[0]:
            return None
        shape = self._layout()[0][name]["shape"]
        digests = self._rows[name]
        if isinstance(digests, str):  # as the memo keeps them: decoded once, when first used
            digests = self._rows[name] = base64.b64decode(digests)
        whole = len(shape) == 2 and shape[0] > 0 and len(digests) == shape[0] * ROW_DIGEST
        return digests if whole else None

    def _read_rows(self, name: str, unique: np.ndarray, digests: bytes) -> np.ndarray:
        """The rows `unique` (sorted) of the tensor, read and each checked, decoded."""
        header, start = self._layout()
        entry = header[name]
        begin, end = entry["data_offsets"]
        size = (end - begin) // entry["shape"][0]
        try:
            raw = read_rows(self._path, [start + begin + int(i) * size for i in unique], size)
        except OSError as exc:
            raise WeightsError(f"cannot read the weights {self._path}: {exc}") from None
        for i, row in zip(unique, raw, strict=True):
            found = hashlib.sha256(row).digest()
            kept = digests[int(i) * ROW_DIGEST : (int(i) + 1) * ROW_DIGEST]
            if found[:ROW_DIGEST] != kept:
                raise changed(self._path, f"{name} row {i}: {found.hex()}", kept.hex())
        return decode(raw.reshape(-1), entry["dtype"]).reshape(len(unique), entry["shape"][1])

    def _layout(self) -> tuple[dict, int]:
        """The file's header (name -> dtype, shape, offsets) and where its data begins."""
        if self._header is None:
            try:
                self._header = read_header(self._path)
            except (OSError, SafetensorsError) as exc:
                raise WeightsError(f"cannot read the weights {self._path}: {exc}") from None
        return self._header

    def _read_checked(self, name: str) -> dict[str, np.ndarray]:
        if name in self._parts and name in self._layout()[0]:
            header, start = self._layout()
            try:
                return {name: self._part(name, header[name], start)}
            except OSError as exc:
                raise WeightsError(f"cannot read the weights {self._path}: {exc}") from None
        try:
            read = read_private(self._path)
            tensors, digest = tensors_in(read.buffer, self._path), read.sha256
        except (OSError, SafetensorsError) as exc:
            raise WeightsError(f"cannot read the weights {self._path}: {exc}") from None
        if digest != self.sha256:
            raise changed(self._path, digest, self.sha256)
        self._parts = {}  # all held now
        if self._read_whole is not None:
            self._read_whole(read, tensors)
        return tensors

    def _part(self, name: str, entry: dict, start: int) -> np.ndarray:
        begin, end = entry["data_offsets"]
        raw = read_range(self._path, start + begin, end - begin)
        digest = hashlib.sha256(raw).hexdigest()
        if digest != self._parts[name]:
            raise changed(self._path, f"{name}: {digest}", self._parts[name])
        return decode(raw, entry["dtype"]).reshape(entry["shape"])

    def _all_names(self) -> list[str]:
        if self._names is None:
            self._names = list(self._layout()[0])
        return self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._all_names())

    def __len__(self) -> int:
        return len(self._all_names())


def changed(path: Path, found: str, wanted: str) -> WeightsError:
    return WeightsError(
        f"{path} changed since the run began (sha256 {found[:40]}, not {wanted[:12]}): "
        "nothing was graded over it; run again"
    )
