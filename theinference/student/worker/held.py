"""What a swap's moment reads of an array and sends of it (part of the worker: imports nothing
of the grader): a checksum that tells it again unchanged, and its bytes, a large array's
without its runs of zeros (protocol.json's run_bytes): a cache allocated whole and filled a
little, such as a pool of blocks, is most of its bytes zeros, which cost a moment a copy and a
pipe of the whole pool when sent dense."""

import sys

if __package__:
    from . import cache_walk, protocol
else:  # loaded by its path, as the worker loads its parts (swap.part): these first
    cache_walk = sys.modules["_theinference_worker_cache_walk"]
    protocol = sys.modules["_theinference_worker_protocol"]


def all_zero(a) -> bool:
    """Whether every value of the array is zero: a row of zeros has no direction, which is
    what the grader's search matches rows by, so no K/V row is there."""
    try:
        return not a.any()
    except TypeError:  # a dtype with no truth: sent, the grader reads it
        return False


RUN = int(protocol.SWAP["run_bytes"])  # a large array is read in runs of this many bytes
SPARSE = 16 * RUN  # bytes: an array this large, C-contiguous, is sent without its zero runs


class Survey:
    """An array as a moment reads it: `mark`, (where it lives, a checksum of its bytes), tells
    it again unchanged; `runs`, for a large C-contiguous array some of whose runs of RUN bytes
    are all zeros, says which are not (bool [ceil(nbytes / RUN)]) and `kept` holds them: only
    those are checksummed and sent (a cache allocated whole and filled a little, such as a
    pool of blocks, is most of its bytes zeros), the rest the grader fills with zeros."""

    def __init__(self, mark: tuple, runs=None, kept=None):
        self.mark, self.runs, self.kept = mark, runs, kept


def survey(a) -> "Survey | None":
    """The array's Survey; None when all its values are zeros (no K/V row is there)."""
    import zlib

    import numpy as np

    if a.nbytes < SPARSE or not a.flags.c_contiguous:
        if all_zero(a):
            return None
        flat = a.reshape(-1, order="A") if a.flags.f_contiguous else np.ascontiguousarray(a)
        return Survey((place_of(a), zlib.crc32(memoryview(flat).cast("B"))))  # about 2 GB/s
    place = place_of(a)
    raw = a.reshape(-1).view(np.uint8)  # [nbytes]
    runs = nonzero_runs(raw)
    if not runs.any():
        return None
    if runs.all():
        return Survey((place, zlib.crc32(raw)))
    kept = kept_runs(raw, runs)
    return Survey((place, zlib.crc32(kept, zlib.crc32(runs))), runs, kept)


def place_of(a) -> tuple:
    """Where an array lives and how it is read there: with its checksum, what tells it again."""
    return (cache_walk.address(a), a.shape, a.strides, a.dtype.str)


def nonzero_runs(raw):
    """bool [ceil(len(raw) / RUN)]: which runs of RUN bytes hold a byte that is not zero."""
    import numpy as np

    whole = raw.size // RUN
    runs = raw[: whole * RUN].view(np.uint64).reshape(whole, RUN // 8).any(axis=1)  # [whole]
    if raw.size > whole * RUN:
        runs = np.append(runs, raw[whole * RUN :].any())
    return runs


def kept_runs(raw, runs) -> bytes:
    """The bytes of the runs not all zeros, in order (the last one as long as it is)."""
    whole = raw.size // RUN
    kept = raw[: whole * RUN].reshape(whole, RUN)[runs[:whole]].tobytes()  # [kept, RUN]
    return kept + raw[whole * RUN :].tobytes() if runs.size > whole and runs[-1] else kept


def sent_arrays(fresh: list) -> tuple[list[dict], list[bytes]]:
    """Each array's description (dtype, shape, its blob, whether it is bfloat16's bits; for a
    large one, its runs not all zeros: `runs`, the blob of one byte per run) and its bytes
    in C order (of those runs alone, where described), as the grader reads them back
    (the grader's reply_arrays.py)."""
    import numpy as np

    descriptions, blobs = [], []
    for source, seen in fresh:
        a = source.array
        description = {"dtype": a.dtype.str, "shape": list(a.shape), "blob": len(blobs),
                       "bf16": source.bf16}
        if seen.runs is None:
            blobs.append(np.ascontiguousarray(a).tobytes())
        else:
            blobs += [seen.kept, seen.runs.astype(np.uint8).tobytes()]
            description["runs"] = len(blobs) - 1
        descriptions.append(description)
    return descriptions, blobs
