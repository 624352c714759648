"""What one call of the student's code comes to, rebuilt from its reply: JSON fields, and
arrays from their raw bytes (never unpickled), and the output it printed, capped."""

import json
import struct
from dataclasses import dataclass, field

import numpy as np

MAX_REPLY_BYTES = 1 << 30
ALLOWED_DTYPES = {"b", "i", "u", "f", "c"}


@dataclass
class Captured:
    """The head of one stream, and how much was cut."""

    data: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def add(self, chunk: bytes, cap: int) -> None:
        room = max(cap - len(self.data), 0)
        self.data += chunk[:room]
        self.dropped += max(len(chunk) - room, 0)

    def text(self) -> str:
        out = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            out += f"\n[... output cut at {len(self.data) // 1024} KiB: {self.dropped} more bytes]"
        return out


@dataclass
class Outcome:
    """What one adapter call came to. kind: returned, todo, raised, import_error, missing,
    signature, timeout, crashed, bad_reply, cancelled."""

    kind: str
    value: object = None
    message: str = ""
    traceback: str = ""
    exception: str = ""  # the exception's type name, when kind is raised
    probe: dict | None = None  # what the cache-use probe did, when one was asked for
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0  # wall time of the call, measured by the grader
    cpu_seconds: float | None = None  # the call's CPU time, measured from outside: see tree_cpu


def decode_reply(payload: bytes) -> Outcome:
    """Rebuild the reply: JSON fields, and arrays from their raw bytes (never unpickled)."""
    try:
        (text_len,) = struct.unpack("<I", payload[:4])
        header = json.loads(payload[4 : 4 + text_len])
        blobs, offset = [], 4 + text_len
        for size in header.get("blob_sizes", []):
            blobs.append(payload[offset : offset + size])
            offset += size
        kind = str(header["outcome"])
        value = rebuild(header["value"], blobs) if kind == "returned" else None
    except (KeyError, ValueError, TypeError, IndexError, struct.error) as exc:
        return Outcome("bad_reply", message=f"unreadable reply from the student process: {exc}")
    return Outcome(
        kind=kind,
        value=value,
        message=str(header.get("message", "")),
        traceback=str(header.get("traceback", "")),
        exception=str(header.get("exception", "")),
        probe=header.get("probe") if isinstance(header.get("probe"), dict) else None,
    )


@dataclass(frozen=True)
class Foreign:
    """A returned value that is not numbers: only its type name crosses over."""

    type: str


def rebuild(desc: dict, blobs: list[bytes]):
    kind = desc["kind"]
    if kind == "none":
        return None
    if kind == "seq":
        return [rebuild(item, blobs) for item in desc["items"]]
    if kind == "array":
        dtype = np.dtype(desc["dtype"])
        if dtype.kind not in ALLOWED_DTYPES:
            raise ValueError(f"dtype {dtype} not allowed")
        shape = tuple(int(n) for n in desc["shape"])
        return np.frombuffer(blobs[int(desc["blob"])], dtype=dtype).reshape(shape)
    return Foreign(type=str(desc.get("type", "object")))
