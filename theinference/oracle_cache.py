"""The oracle's answers, computed once per weights file and reused: in memory for a watch
session, on disk across processes.

A key is the weights' sha256, the oracle's version, the check and its exact arguments, so a
changed oracle, case or checkpoint can never be served a stale answer. Files are written under
a temporary name and renamed into place; an unreadable file is a miss (recomputed and
rewritten), and a cache that cannot be written (full disk, read-only) is switched off for the
run with a note, never an error.
"""

import hashlib
import json
import os
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from theinference.oracle import LayerKV

ORACLE_VERSION = 1  # bump whenever oracle.py's arithmetic changes
MEMORY_ENTRIES = 64


class OracleCache:
    def __init__(self, weights_sha256: str, directory: Path | None):
        self.weights_sha256 = weights_sha256
        self.directory = directory / "oracle" / weights_sha256[:16] if directory else None
        self._memory: OrderedDict[str, object] = OrderedDict()
        self.notes: list[str] = []
        self.hits = self.misses = 0

    def key(self, check: str, args: list) -> str:
        text = json.dumps([ORACLE_VERSION, self.weights_sha256, check, args])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get_or_compute(self, check: str, args: list, compute):
        key = self.key(check, args)
        if key in self._memory:
            self._memory.move_to_end(key)
            self.hits += 1
            return self._memory[key]
        value = self._load(key)
        if value is None:
            self.misses += 1
            value = compute()
            self._store(key, value)
        else:
            self.hits += 1
        self._remember(key, value)
        return value

    def _remember(self, key: str, value) -> None:
        self._memory[key] = value
        if len(self._memory) > MEMORY_ENTRIES:
            self._memory.popitem(last=False)

    def _load(self, key: str):
        if self.directory is None:
            return None
        path = self.directory / f"{key}.npz"
        try:
            with np.load(path, allow_pickle=False) as data:
                return unpack({name: data[name] for name in data.files})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
            return None  # damaged: recompute, and the store below replaces it

    def _store(self, key: str, value) -> None:
        if self.directory is None:
            return
        path = self.directory / f"{key}.npz"
        tmp = path.with_name(f".{key}.{os.getpid()}.tmp.npz")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            np.savez(tmp, **pack(value))
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            self.notes.append(
                f"oracle cache off for this run ({exc.strerror or exc}): "
                "answers are recomputed, results are unaffected"
            )
            self.directory = None


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
