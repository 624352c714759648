"""What a swap's moment reads of an array and sends of it (part of the worker: imports nothing
of the grader): whether it is all zeros or of one sign, a checksum that tells it again
unchanged, and its bytes."""

import sys

if __package__:
    from . import cache_walk
else:  # loaded by its path, as the worker loads its parts (swap.part): this first
    cache_walk = sys.modules["_theinference_worker_cache_walk"]


def all_zero(a) -> bool:
    """Whether every byte of the array is zero: a row of zeros has no direction, which is what
    the grader's search matches rows by, so no K/V row is there. Read as 8-byte words where the
    array is one block of memory (a pool of 75 MB in 1 ms, a quarter of a float reading's
    time); a -0.0 is not zero here, and is sent (the grader reads it as no row)."""
    import numpy as np

    if a.flags.c_contiguous or a.flags.f_contiguous:
        raw = memoryview(a.reshape(-1, order="A")).cast("B")
        words = np.frombuffer(raw, dtype=np.uint64, count=len(raw) // 8)
        return not words.max(initial=0) and not any(raw[words.size * 8 :])
    try:
        return not a.any()
    except TypeError:  # a dtype with no truth: sent, the grader reads it
        return False


SIGNED_LEAST = 1 << 16  # values: a smaller array costs more to read for its signs than to send
SIGNED_PEEK = 1 << 12  # values read first: where both signs are among them, the array is not one


def one_signed(a) -> bool:
    """Whether every value of the float array, of SIGNED_LEAST values or more, is >= 0, or
    every one <= 0 (NaN: neither). Where the grader says so (its answer's one_signed), such an
    array holds no K/V row: attention probabilities, [heads, n, n], the largest array a
    prefill makes, are never sent. (A cache of a thousand small arrays is read as before.)"""
    if a.size < SIGNED_LEAST or a.dtype.kind != "f":
        return False
    first = a.flat[:SIGNED_PEEK]  # a K/V array shows both signs here: not read whole
    if first.min() < 0 < first.max():
        return False
    return bool(a.min() >= 0) or bool(a.max() <= 0)


def mark(a) -> "tuple[tuple, int] | None":
    """(where the array lives, a checksum of its bytes): what tells it again unchanged; None
    when all its values are zeros (no K/V row is there). Zeros are told first: a pool
    allocated whole is seen at every return before its prefill, and its checksum costs
    several times the read that finds it empty."""
    import zlib

    import numpy as np

    if a.nbytes <= SMALL_BYTES:  # one copy, read in C: a per-token cache holds thousands
        raw = a.tobytes()
        return None if not raw.strip(b"\0") else (place_of(a), zlib.crc32(raw))
    if all_zero(a):
        return None
    flat = a.reshape(-1, order="A") if a.flags.f_contiguous else np.ascontiguousarray(a)
    return place_of(a), checksum(memoryview(flat).cast("B"))


SMALL_BYTES = 1 << 16  # an array this small is marked from a copy of its bytes (4 us, not 25)


WIDTH = 1024  # words of a checksum's grid row


def checksum(raw: memoryview) -> int:
    """A checksum of the bytes that changes with any write of correct code: the sums (mod
    2**64) of the 8-byte words down each column and along each row of a grid WIDTH words wide,
    and the bytes past it, crc32'd. A value moved changes its row's or its column's sum.
    About 9 GB/s, four times crc32's over the whole: a pool of 75 MB is looked at at every
    return of a prefill. (A checksum the student's code sets on purpose gains nothing: an array
    called unchanged only has its earlier rows written, and the answer judges the swap.)"""
    import zlib

    import numpy as np

    words = len(raw) // (8 * WIDTH) * WIDTH
    grid = np.frombuffer(raw, dtype=np.uint64, count=words).reshape(-1, WIDTH)
    columns, rows = grid.sum(axis=0, dtype=np.uint64), grid.sum(axis=1, dtype=np.uint64)
    return zlib.crc32(raw[words * 8 :], zlib.crc32(rows, zlib.crc32(columns)))


def place_of(a) -> tuple:
    """Where an array lives and how it is read there: with its checksum, what tells it again."""
    return (cache_walk.address(a), a.shape, a.strides, a.dtype.str)


def sent_arrays(fresh: list, searched: dict, numbered: int) -> tuple[list[dict], list]:
    """Each array's description (dtype, shape, its blob, whether it is bfloat16's bits, the
    number it is given, from `numbered` on) and its bytes in C order, as the grader reads them
    back (the grader's reply_arrays.py); or, for one the grader found rows in at an earlier
    moment and unchanged since (`searched`: its place -> (checksum, number)), its number
    alone."""
    import numpy as np

    descriptions, blobs = [], []
    for source, (place, digest) in fresh:
        before = searched.get(place)  # (one searched barren and unchanged is not in `fresh`)
        if before is not None and before[0] == digest and before[1] is not None:
            descriptions.append({"known": before[1]})
            continue
        a = source.array
        descriptions.append({"dtype": a.dtype.str, "shape": list(a.shape), "blob": len(blobs),
                             "bf16": source.bf16, "number": numbered})
        blobs.append(memoryview(np.ascontiguousarray(a)).cast("B"))  # written before it changes
        numbered += 1
    return descriptions, blobs
