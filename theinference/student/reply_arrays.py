"""The arrays of a reply, rebuilt from the frame's raw bytes without trusting a byte of it
(replies.py decodes the rest): a returned value's, and those a hook's moment sent to be
searched for the cache (worker/held.py's sent_arrays). A frame that says what its bytes do
not hold is a BadReply, never an exception."""

import re
from dataclasses import dataclass

import numpy as np

from theinference.student.worker import protocol
from theinference.student.worker.cache_memory import Source
from theinference.student.worker.protocol import LIMITS

ALLOWED_DTYPES = protocol.DTYPE_KINDS
MAX_REPLY_BYTES = LIMITS["max_reply_bytes"]  # a whole frame, arrays included
MAX_DIMS = LIMITS["max_dims"]
MAX_DIM = LIMITS["max_dim"]
DTYPE_TEXT = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")


class BadReply(ValueError):
    """A frame the worker would never write; the message says what is wrong with it."""


class Blobs(list):
    """A frame's blobs, as the arrays of its value name them: the worker names each once, but
    a frame is the student's process's to write, so the bytes named in all are held to
    MAX_REPLY_BYTES, as the frame's are (a small blob named a million times would be a reply
    of terabytes to whatever reads its arrays)."""

    def __init__(self, blobs: list):
        super().__init__(blobs)
        self.named = 0

    def name(self, index: int):
        blob = self[index]
        self.named += len(blob)
        if self.named > MAX_REPLY_BYTES:
            raise BadReply(f"its arrays name over {MAX_REPLY_BYTES >> 30} GiB of the bytes sent")
        return blob


class Sent(Source):
    """An array a hook's moment sent, with the number the worker gave it (None: none), by
    which a later moment names it again unchanged (Known) instead of sending it."""

    def __init__(self, array, bf16: bool, number: int | None):
        super().__init__(array, bf16=bf16)
        self.number = number


@dataclass(frozen=True)
class Known:
    """An array sent at an earlier moment of the call (its number), unchanged since: the
    grader's search of it then still stands (swap_search.Search's memo)."""

    number: int


def held_arrays(descriptions, blobs: Blobs) -> list[Sent | Known]:
    """What a hook sent to be searched for the cache (worker/held.py's sent_arrays): arrays
    of numbers, a bfloat16 one as its bits in 2-byte integers, or an earlier one's number."""
    if not isinstance(descriptions, list):
        raise BadReply("a hook's held arrays are not a list")
    held = []
    for desc in descriptions:
        if not isinstance(desc, dict):
            raise BadReply("a held array is not described by an object")
        if "known" in desc:
            held.append(Known(counted(desc["known"], "an unchanged array's number")))
            continue
        array, bf16 = rebuild_array(desc, blobs), desc.get("bf16") is True
        if bf16 and not (array.dtype.kind in "iu" and array.dtype.itemsize == 2):
            raise BadReply(f"a bfloat16 array's bits are {array.dtype}, not 2-byte integers")
        number = desc.get("number")
        held.append(Sent(array, bf16, None if number is None else counted(number, "its number")))
    return held


def counted(n, what: str) -> int:
    if not is_count(n):
        raise BadReply(f"{what} {str(n)[:20]} is not a count")
    return n


def rebuild_array(desc: dict, blobs: Blobs):
    """An array read from its blob: a numeric dtype, a shape that holds exactly its bytes."""
    dtype, shape = array_type(desc)
    blob = blobs.name(blob_index(desc.get("blob"), blobs))
    if prod(shape) * dtype.itemsize != len(blob):
        raise BadReply(f"shape {shape} of {dtype} does not fit the {len(blob)} bytes sent")
    return np.frombuffer(blob, dtype=dtype).reshape(tuple(shape))


def array_type(desc: dict) -> tuple[np.dtype, list[int]]:
    """An array's dtype (numeric) and shape (counts), as described."""
    dtype_text, shape = desc.get("dtype"), desc.get("shape")
    if not isinstance(dtype_text, str) or not DTYPE_TEXT.fullmatch(dtype_text):
        raise BadReply(f"dtype {str(dtype_text)[:40]!r} is not a numeric type")
    dtype = np.dtype(dtype_text)
    if dtype.kind not in ALLOWED_DTYPES:
        raise BadReply(f"dtype {dtype} not allowed")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise BadReply("an array's shape is not a list of at most 32 sizes")
    if not all(is_count(n) and n <= MAX_DIM for n in shape):
        raise BadReply(f"an array's shape {shape[:4]} holds a size that is not a count")
    return dtype, shape


def blob_index(index, blobs: Blobs) -> int:
    if not is_count(index) or index >= len(blobs):
        raise BadReply(f"an array names blob {str(index)[:20]}, of {len(blobs)} sent")
    return index


def is_count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def prod(shape: list[int]) -> int:
    total = 1
    for n in shape:
        total *= n  # Python integers: no overflow, whatever the sizes
    return total
