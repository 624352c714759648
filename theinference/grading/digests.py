"""The weights files' digests a grader has computed, kept on disk beside the answer cache and
signed with its secret, so a warm run need not read and hash 500 MB before the first case.

A digest is trusted exactly where the answers are: a run whose student process could read the
secret (it runs as the grader's own user) is given no memo (session.py), and a memo written by
anything without the secret is a miss. An entry is a file's StatKey (its inode, size, mtime and
ctime: a write moves ctime, which os.utime cannot put back), the sha256 of the bytes read and
that of each tensor's (and of each row of the token embedding): a tensor, or a row, is still
read and hashed before the oracle computes on it (oracle/private_copy.py), alone where the run
needs only a few.
"""

import hashlib
import hmac
import json
from pathlib import Path

from theinference.atomic import atomic_write
from theinference.grading.answer_cache import KEY_FILE, MAC_BYTES, read_or_make_secret
from theinference.oracle.private_copy import Digests, StatKey

MEMO_FILE = "weights-digests"
KEPT = 8  # files remembered, the last learned kept


class SignedDigests:
    """A DigestMemo in the cache directory `root`; off (knows nothing, learns nothing) where
    the secret cannot be had."""

    def __init__(self, root: Path):
        self.path = root / MEMO_FILE
        try:
            self._secret: bytes | None = read_or_make_secret(root / KEY_FILE)
        except OSError:
            self._secret = None

    def known(self, key: StatKey) -> Digests | None:
        return self._entries().get(json.dumps(list(key)))

    def learn(self, key: StatKey, digests: Digests) -> None:
        if self._secret is None:
            return
        entries = self._entries()
        entries.pop(json.dumps(list(key)), None)
        entries[json.dumps(list(key))] = digests
        payload = json.dumps(dict(list(entries.items())[-KEPT:])).encode()
        try:
            atomic_write(self.path, self._mac(payload) + payload, 0o600)
        except OSError:
            pass  # a memo not kept: the next run reads the file again

    def _entries(self) -> dict[str, Digests]:
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
        good = isinstance(entries, dict) and all(well_formed(v) for v in entries.values())
        return entries if good else {}

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret or b"", b"digests\0" + payload, hashlib.sha256).digest()


def well_formed(digests: object) -> bool:
    return (isinstance(digests, dict) and isinstance(digests.get("sha256"), str)
            and isinstance(digests.get("parts", {}), dict)
            and isinstance(digests.get("rows", {}), dict)
            and all(isinstance(v, str) for v in digests.get("rows", {}).values()))
