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
        shared = {} if isinstance(value, (list, tuple)) and repeats(value) else None
        reply = {**reply, "value": describe(value, blobs, depth=0, shared=shared)}
    return reply, blobs


def describe(value, blobs: list[bytes], depth: int, shared: dict | None = None) -> dict:
    """A JSON-safe description of what the adapter returned; numeric arrays travel as bytes.
    A value whose lists hold one array object in several places (a cache whose layers share
    one array, a classic bug) has its lists described item by item, each array sent once
    (`shared`: its id -> (the array, kept so that its id stays its own; its description)),
    not stacked into copies."""
    import numpy as np

    if shared is not None and id(value) in shared:
        return shared[id(value)][1]
    if value is None:
        return {"kind": "none"}
    if isinstance(value, (str, bytes, dict, set)):
        return {"kind": "other", "type": type(value).__name__}
    whole = shared is None or not isinstance(value, (list, tuple)) or depth >= MAX_SEQ_DEPTH
    try:
        array = np.asarray(to_numpy(value)) if whole else None
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
        if shared is not None and is_array(value):
            shared[id(value)] = (value, described)
        return described
    if isinstance(value, (list, tuple)) and depth < MAX_SEQ_DEPTH:
        # e.g. per-layer (k, v) pairs whose shapes differ: describe item by item
        items = [describe(v, blobs, depth + 1, shared) for v in value[:MAX_ITEMS]]
        return {"kind": "seq", "items": items, "length": len(value)}
    if array is not None:
        return {"kind": "other", "type": f"array of dtype {array.dtype}", "shape": array.shape}
    return {"kind": "other", "type": type(value).__name__}


def repeats(value) -> bool:
    """Whether lists within `value` (as far as they are described item by item) hold one
    array object in two places or more."""
    seen, stack = set(), [(value, 0)]
    while stack:
        node, depth = stack.pop()
        for item in node[:MAX_ITEMS]:
            if is_array(item):
                if id(item) in seen:
                    return True
                seen.add(id(item))
            elif isinstance(item, (list, tuple)) and depth + 1 < MAX_SEQ_DEPTH:
                stack.append((item, depth + 1))
    return False


def is_array(value) -> bool:
    """An array object (NumPy's, or a tensor's: what to_numpy reads), not a Python number."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)


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
