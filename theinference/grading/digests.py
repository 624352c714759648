"""What a grader computed and keeps on disk beside the answer cache, signed with its secret:
the weights files' digests (so a warm run need not read and hash 500 MB before the first case)
and the machine's measured rate (so a run soon after another need not measure it again).

A memo is trusted exactly where the answers are: a run whose student process could read the
secret (it runs as the grader's own user) is given none (session.py), and a memo written by
anything without the secret is a miss. A digests entry is a file's StatKey (its inode, size,
mtime and ctime: a write moves ctime, which os.utime cannot put back), the sha256 of the bytes
read and that of each tensor's (and of each row of the token embedding): a tensor, or a row, is
still read and hashed before the oracle computes on it (oracle/private_copy.py), alone where the
run needs only a few. A rate entry is when it was measured (wall clock) and the rate.
"""

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.grading.answer_cache import KEY_FILE, MAC_BYTES, read_or_make_secret
from theinference.oracle.private_copy import Digests, StatKey

MEMO_FILE = "weights-digests"
RATES_FILE = "machine-rates"
KEPT = 8  # entries remembered, the last learned kept


class SignedMemo:
    """Entries (JSON, by a string key) in the file `name` of the cache directory `root`, each
    well formed by `check`; off (knows nothing, learns nothing) where the secret cannot be
    had. `tag` keeps one memo's signed bytes from passing for another's."""

    def __init__(self, root: Path, name: str, tag: bytes, check: Callable[[object], bool]):
        self.path, self.tag, self.check = root / name, tag, check
        try:
            self._secret: bytes | None = read_or_make_secret(root / KEY_FILE)
        except OSError:
            self._secret = None

    def known(self, key: str):
        return self._entries().get(key)

    def learn(self, key: str, value) -> None:
        if self._secret is None:
            return
        entries = self._entries()
        entries.pop(key, None)
        entries[key] = value
        payload = json.dumps(dict(list(entries.items())[-KEPT:])).encode()
        try:
            atomic_write(self.path, self._mac(payload) + payload, 0o600)
        except OSError:
            pass  # not kept: the next run computes it again

    def _entries(self) -> dict:
        if self._secret is None:
            return {}
        try:
            blob = self.path.read_bytes()
        except OSError:
            return {}
        mac, payload = blob[:MAC_BYTES], blob[MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(payload)):
            return {}  # not written by a grader holding the secret
        try:
            entries = json.loads(payload)
        except ValueError:
            return {}
        good = isinstance(entries, dict) and all(self.check(v) for v in entries.values())
        return entries if good else {}

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret or b"", self.tag + b"\0" + payload, hashlib.sha256).digest()


class SignedDigests:
    """A DigestMemo (oracle/private_copy.py) in the cache directory `root`."""

    def __init__(self, root: Path):
        self.memo = SignedMemo(root, MEMO_FILE, b"digests", well_formed)
        self.path = self.memo.path

    def known(self, key: StatKey) -> Digests | None:
        return self.memo.known(json.dumps(list(key)))

    def learn(self, key: StatKey, digests: Digests) -> None:
        self.memo.learn(json.dumps(list(key)), digests)


class SignedRates:
    """A RateMemo (student/calibration.py) in the cache directory `root`: a rate measured
    within the last `fresh_for` seconds by any grader of this cache, for the same key."""

    def __init__(self, root: Path):
        self.memo = SignedMemo(root, RATES_FILE, b"rates", rate_well_formed)

    def known(self, key: tuple, fresh_for: float) -> float | None:
        kept = self.memo.known(json.dumps(list(key)))
        if kept is None or not 0 <= time.time() - kept["when"] < fresh_for:
            return None
        return kept["rate"]

    def learn(self, key: tuple, rate: float) -> None:
        self.memo.learn(json.dumps(list(key)), {"when": time.time(), "rate": rate})


def well_formed(digests: object) -> bool:
    return (isinstance(digests, dict) and isinstance(digests.get("sha256"), str)
            and isinstance(digests.get("parts", {}), dict)
            and isinstance(digests.get("rows", {}), dict)
            and all(isinstance(v, str) for v in digests.get("rows", {}).values()))


def rate_well_formed(kept: object) -> bool:
    return (isinstance(kept, dict) and all(isinstance(kept.get(k), float) for k in ("when", "rate"))
            and kept["rate"] > 0)
