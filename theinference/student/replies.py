"""What the student's process sent back, decoded without trusting a byte of it.

A reply is the student's: its process writes the frame, so a frame can be anything. Decoding
is total: a frame that is not what the worker writes (nested past any value the worker
describes, sizes that do not add up, offsets past the end, shapes that do not match the bytes,
text that is not UTF-8, NaN where a count belongs...) is the call's `bad_reply` with a message,
never an exception in the grader. Nothing here recurses deeper than MAX_NESTING.

The frame after its length (worker/protocol.json's framing; the worker's wire.py, write_message):
the JSON header's length, the header, then the arrays' raw bytes back to back (never unpickled).
"""

import json
import re
from dataclasses import dataclass, field

from theinference.student.reply_arrays import (
    BadReply,
    Blobs,
    held_arrays,
    is_count,
    rebuild_array,
)
from theinference.student.worker import protocol
from theinference.student.worker.protocol import LIMITS, OUTCOMES

# the worker describes lists at most 4 deep inside a header that is itself 2 deep (value, items)
MAX_NESTING = LIMITS["max_nesting"]
MAX_HEADER_BYTES = LIMITS["max_header_bytes"]  # messages, value descriptions (not the arrays)
MAX_CONTAINERS = LIMITS["max_containers"]  # lists and objects in a header; a worker's: thousands
MAX_TYPE_NAME = LIMITS["max_type_name"]
# what the worker says: ready, loaded (after the grader's go), an adapter call's outcome, and
# hooked (mid-call: a cache-use hook's word, answered by channel.py)
REPLY_KINDS = OUTCOMES
TEXT_FIELDS = ("message", "traceback", "exception")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class Captured:
    """The head of one stream the student's process printed to, and how much was cut."""

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
    signature, timeout, cpu_limit, memory_limit, crashed, bad_reply, cancelled."""

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
    # what the grader measured of a call alone against a CPU budget (measured.cpu_bounded_call):
    # the grader's own figures, never the student's process's (that is `probe`)
    measured: dict | None = None


@dataclass(frozen=True)
class Foreign:
    """A returned value that is not numbers: only its type name crosses over."""

    type: str


def decode_reply(payload: bytes) -> Outcome:
    """The call's outcome from one frame: its fields, and arrays rebuilt from their raw bytes.
    Any frame that cannot be read is a `bad_reply`; nothing it holds can raise out of here."""
    try:
        header, blobs = split_frame(payload)
        return outcome_of(header, blobs)
    except BadReply as exc:
        why = str(exc)
    except RecursionError:  # json's own C decoder, on a frame nested past the interpreter's limit
        why = "it is nested too deeply"
    except Exception as exc:  # noqa: BLE001 (no failure to read the student's bytes may escape)
        why = f"{type(exc).__name__}: {exc}"
    return Outcome("bad_reply", message=f"unreadable reply from the student process: {why}")


def split_frame(payload: bytes) -> tuple[dict, list[memoryview]]:
    """The JSON header (checked for depth, text made safe) and one view per blob."""
    start = protocol.HEADER_LENGTH.size
    if len(payload) < start:
        raise BadReply(f"a frame of {len(payload)} bytes has no header length")
    (text_len,) = protocol.HEADER_LENGTH.unpack(payload[:start])
    if text_len > len(payload) - start:
        raise BadReply(f"its header claims {text_len} bytes, past the end of the frame")
    if text_len > MAX_HEADER_BYTES:
        raise BadReply(f"its header is over {MAX_HEADER_BYTES >> 20} MiB")
    header = parse_header(bytes(payload[start : start + text_len]))
    sizes = header.get(protocol.BLOB_SIZES, [])
    if not isinstance(sizes, list) or not all(is_count(n) for n in sizes):
        raise BadReply("blob_sizes is not a list of byte counts")
    rest = memoryview(payload)[start + text_len :]
    if sum(sizes) != len(rest):
        raise BadReply(f"its arrays' sizes add up to {sum(sizes)} bytes, not the {len(rest)} sent")
    blobs, offset = [], 0
    for size in sizes:
        blobs.append(rest[offset : offset + size])
        offset += size
    return header, blobs


def parse_header(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadReply("its header is not UTF-8 text") from None
    try:
        header = json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as exc:
        raise BadReply(f"its header is not JSON ({exc.msg})") from None
    if not isinstance(header, dict):
        raise BadReply(f"its header is a JSON {type(header).__name__}, not an object")
    check_nesting(header)
    return header


def refuse_constant(name: str):
    raise BadReply(f"its header holds {name}, which JSON does not allow")


def check_nesting(root) -> None:
    """Refuse containers nested past MAX_NESTING or more than MAX_CONTAINERS of them, walking
    with a stack (never recursing), and replace lone surrogates in every string value, which
    no output could encode."""
    stack, seen = [(root, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_NESTING:
            raise BadReply(f"it is nested more than {MAX_NESTING} deep")
        if seen > MAX_CONTAINERS:
            raise BadReply(f"it holds more than {MAX_CONTAINERS} lists and objects")
        keys = node.keys() if isinstance(node, dict) else range(len(node))
        for key in keys:
            child = node[key]
            if isinstance(child, str) and LONE_SURROGATE.search(child):
                node[key] = LONE_SURROGATE.sub("\ufffd", child)
            elif isinstance(child, dict | list):
                stack.append((child, depth + 1))


def outcome_of(header: dict, blobs: list[memoryview]) -> Outcome:
    kind = header.get("outcome")
    if kind not in REPLY_KINDS:
        raise BadReply(f"outcome {str(kind)[:40]!r} is none the worker gives")
    texts = {name: text_field(header, name) for name in TEXT_FIELDS}
    blobs = Blobs(blobs)
    value = rebuild(header.get("value"), blobs) if kind == "returned" else None
    probe = header.get("probe") if isinstance(header.get("probe"), dict) else None
    if kind == "hooked" and probe is not None and "held" in probe:
        probe = {**probe, "held": held_arrays(probe["held"], blobs)}
    return Outcome(kind=kind, value=value, probe=probe, **texts)


def text_field(header: dict, name: str) -> str:
    value = header.get(name)
    if value is None:
        return ""
    if isinstance(value, str | int | float | bool):
        return str(value)
    raise BadReply(f"its {name} is a {type(value).__name__}, not text")


def rebuild(desc, blobs: Blobs, depth: int = 0):
    """A returned value from its description: None, a list of values, an array of numbers, or
    a Foreign type name. At most MAX_NESTING deep, whatever the description says."""
    if depth > MAX_NESTING:
        raise BadReply(f"its value is nested more than {MAX_NESTING} deep")
    if not isinstance(desc, dict):
        raise BadReply(f"a value is described by a {type(desc).__name__}, not an object")
    kind = desc.get("kind")
    if kind == "none":
        return None
    if kind == "seq":
        items = desc.get("items")
        if not isinstance(items, list):
            raise BadReply("a list's items are not a list")
        return [rebuild(item, blobs, depth + 1) for item in items]
    if kind == "array":
        return rebuild_array(desc, blobs)
    if kind == "other":
        name = desc.get("type", "object")
        return Foreign(type=(name if isinstance(name, str) else "object")[:MAX_TYPE_NAME])
    raise BadReply(f"a value of kind {str(kind)[:40]!r}")
