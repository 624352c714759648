"""The reply on the wire: JSON describing the returned value, plus the raw bytes of its arrays
(never pickle), framed as protocol.json says (a length, the JSON's length, the JSON, then the
blobs back to back). Part of the worker: imports nothing of the grader."""

import json
import sys

if __package__:
    from . import protocol
else:  # loaded by its path, as the worker loads its parts (worker.sibling): protocol first
    protocol = sys.modules["_theinference_worker_protocol"]

MAX_ITEMS = protocol.LIMITS["max_items"]  # items described per list (not one numeric array)
MAX_SEQ_DEPTH = protocol.LIMITS["max_seq_depth"]  # lists described item by item to this depth


def encode_reply(reply: dict) -> tuple[dict, list[bytes]]:
    blobs: list[bytes] = []
    if reply["outcome"] == "returned":
        value = reply["value"]
        twice = held_twice(value) if isinstance(value, (list, tuple)) else set()
        shared = Shared(twice) if twice else None
        reply = {**reply, "value": describe(value, blobs, depth=0, shared=shared)}
    return reply, blobs


class Shared:
    """The arrays a value's lists hold in two places or more (`twice`: their ids), and those
    described so far (`sent`: id -> (the array, kept so that its id stays its own; its
    description)): each is sent once, and only the lists that hold one are described item by
    item instead of as one array of copies."""

    def __init__(self, twice: set[int]):
        self.twice, self.sent = twice, {}

    def splits(self, value, depth: int) -> bool:
        """Whether the list `value` is described item by item: it holds a shared array."""
        if not isinstance(value, (list, tuple)) or depth >= MAX_SEQ_DEPTH:
            return False
        return bool(array_ids(value, depth) & self.twice)


def describe(value, blobs: list[bytes], depth: int, shared: Shared | None = None) -> dict:
    """A JSON-safe description of what the adapter returned; numeric arrays travel as bytes.
    A list that holds one array object in several places (a cache whose layers share one
    array, a classic bug) is described item by item, each array sent once (Shared)."""
    import numpy as np

    if shared is not None and id(value) in shared.sent:
        return shared.sent[id(value)][1]
    if value is None:
        return {"kind": "none"}
    if isinstance(value, (str, bytes, dict, set)):
        return {"kind": "other", "type": type(value).__name__}
    split = shared is not None and shared.splits(value, depth)
    try:
        array = None if split else np.asarray(to_numpy(value))
    except Exception:  # noqa: BLE001 (ragged lists, exotic objects)
        array = None
    if array is not None and array.dtype.kind in "biufc":
        blobs.append(np.ascontiguousarray(array).tobytes())
        described = {
            "kind": "array",
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "blob": len(blobs) - 1,
            "from": type(value).__name__,
        }
        if shared is not None and id(value) in shared.twice:
            shared.sent[id(value)] = (value, described)
        return described
    if isinstance(value, (list, tuple)) and depth < MAX_SEQ_DEPTH:
        # e.g. per-layer (k, v) pairs whose shapes differ: describe item by item
        items = [describe(v, blobs, depth + 1, shared) for v in value[:MAX_ITEMS]]
        return {"kind": "seq", "items": items, "length": len(value)}
    if array is not None:
        return {"kind": "other", "type": f"array of dtype {array.dtype}", "shape": array.shape}
    return {"kind": "other", "type": type(value).__name__}


def held_twice(value) -> set[int]:
    """The ids of the array objects that lists within `value` (as far as they are described
    item by item) hold in two places or more."""
    seen: set[int] = set()
    twice: set[int] = set()
    for found in array_ids(value, 0, each=True):
        (twice if found in seen else seen).add(found)
    return twice


def array_ids(value, depth: int, each: bool = False):
    """The ids of the arrays within the lists of `value` from `depth` on: a set, or every
    finding in order (`each`); none where a list cannot be read through."""
    found, stack = [], [(value, depth)]
    while stack:
        node, level = stack.pop()
        try:
            items = list(node[:MAX_ITEMS])
        except Exception:  # noqa: BLE001 (a list of the student's own kind that raises)
            return [] if each else set()
        for item in items:
            if is_array(item):
                found.append(id(item))
            elif isinstance(item, (list, tuple)) and level + 1 < MAX_SEQ_DEPTH:
                stack.append((item, level + 1))
    return found if each else set(found)


def is_array(value) -> bool:
    """An array object of one dimension or more (NumPy's, or a tensor's: what to_numpy
    reads), not a number, NumPy's scalars included."""
    try:
        ndim = getattr(value, "ndim", 0)
        return isinstance(ndim, int) and ndim >= 1 and hasattr(value, "dtype")
    except Exception:  # noqa: BLE001 (an object whose attributes raise: not one)
        return False


def to_numpy(value):
    # PyTorch tensors (and similar) that still track gradients or live elsewhere
    for method in ("detach", "cpu"):
        if hasattr(value, method) and hasattr(value, "numpy"):
            value = getattr(value, method)()
    return value


# --- framing (protocol.json): length, JSON length, JSON, then the blobs back to back ---------


def read_message(stream):
    """The grader's next message (a JSON object), or None when it has gone (even mid-message).
    One that is not a JSON object ends the worker (protocol.json: malformed_exit)."""
    prefix = stream.read(protocol.LENGTH.size)
    if len(prefix) < protocol.LENGTH.size:
        return None
    (size,) = protocol.LENGTH.unpack(prefix)
    body = stream.read(size)
    if len(body) < size:
        return None
    try:
        message = json.loads(body)
    except ValueError:  # not JSON, or not UTF-8
        message = None
    if not isinstance(message, dict):
        sys.exit(protocol.MALFORMED_EXIT)
    return message


def read_request(stream):
    """The next call asked for (read_message's), which names an adapter and gives its
    arguments as a list, or the worker ends as on a message that is not JSON."""
    request = read_message(stream)
    if request is not None and not (
        isinstance(request.get("adapter"), str) and isinstance(request.get("args"), list)
    ):
        sys.exit(protocol.MALFORMED_EXIT)
    return request


def read_frame(stream) -> tuple[dict, list[bytes]]:
    """A frame as replies have it (JSON, then raw blobs): a hook's answer from the grader. An
    empty answer when the grader has gone."""
    head = protocol.REPLY_HEAD
    prefix = stream.read(head.size)
    if len(prefix) < head.size:
        return {}, []
    size, text_len = head.unpack(prefix)
    body = stream.read(size - protocol.HEADER_LENGTH.size)
    header = json.loads(body[:text_len])
    blobs, offset = [], text_len
    for n in header.get(protocol.BLOB_SIZES, []):
        blobs.append(body[offset : offset + n])
        offset += n
    return header, blobs


def write_message(stream, header: dict, blobs: list[bytes]) -> None:
    header = {**header, protocol.BLOB_SIZES: [len(b) for b in blobs]}
    text = json.dumps(header, default=str).encode()
    size = protocol.HEADER_LENGTH.size + len(text) + sum(map(len, blobs))
    stream.write(protocol.REPLY_HEAD.pack(size, len(text)))
    stream.write(text)
    for blob in blobs:
        stream.write(blob)
    stream.flush()
