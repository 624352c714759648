"""A large array a swap's moment reads is sent without its runs of zeros (worker/held.py's
Survey, protocol.json's run_bytes) and read back whole by the grader (reply_arrays.rebuild_runs):
a pool of cache blocks allocated whole and filled a little is mostly zeros, and sending it
dense cost a swapped call a copy and a pipe of 75 MB. The grader reads the frame as the
student's: any runs it says are checked, never trusted."""

import json
import struct

import numpy as np
import pytest

from theinference.student.replies import decode_reply
from theinference.student.reply_arrays import MAX_REPLY_BYTES, RUN_BYTES, Blobs, held_arrays
from theinference.student.worker import held as swap_held
from theinference.student.worker.cache_memory import Source

FLOATS_A_RUN = RUN_BYTES // 4


def crossed(*arrays) -> tuple[list[np.ndarray], int]:
    """The arrays as a moment sends them and the grader reads them back, and the bytes sent."""
    fresh = [(Source(a), swap_held.survey(a)) for a in arrays]
    descriptions, blobs = swap_held.sent_arrays(fresh)
    held = held_arrays(json.loads(json.dumps(descriptions)), Blobs(blobs))
    return [s.array for s in held], sum(map(len, blobs))


def pool() -> np.ndarray:
    """A paged cache's pool, [blocks, heads, 16, head_dim], with a few blocks written."""
    blocks = np.zeros((768, 12, 16, 64), dtype=np.float32)
    rng = np.random.default_rng(0)
    for block in (0, 5, 64, 700):
        blocks[block, :, :3] = rng.standard_normal((12, 3, 64))
    return blocks


def test_a_pool_mostly_zeros_crosses_without_its_zero_runs_and_arrives_whole():
    """Catches runs put back in the wrong place or not at all (the grader would search, and
    the swap write, rows that are not the student's), and a large array sent dense."""
    blocks = pool()
    (back,), sent = crossed(blocks)
    assert back.dtype == blocks.dtype and back.shape == blocks.shape
    assert np.array_equal(back, blocks)
    assert sent < blocks.nbytes // 100, sent


@pytest.mark.parametrize("tail", ["written", "zeros"])
def test_an_array_whose_last_run_is_short_arrives_whole(tail):
    """Catches the last run (shorter than run_bytes) lost, padded or shifted, written or not."""
    a = np.zeros(FLOATS_A_RUN * 20 + 3, dtype=np.float32)
    a[FLOATS_A_RUN * 7 + 1] = 2.5
    if tail == "written":
        a[-1] = -1.0
    (back,), _ = crossed(a)
    assert np.array_equal(back, a)


def test_a_dense_array_and_a_view_cross_as_before():
    """Catches the zero runs' form used where it cannot apply (a view with gaps) or gains
    nothing (no run of zeros), and a small array's values changed on the way."""
    dense = np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)
    strided = np.zeros((2, 64, 1024), dtype=np.float32)[:, ::2]
    strided[0, 3] = 1.0
    small = np.array([[0.0] * 64, [1.0] * 64], dtype=np.float32)
    for a in (dense, strided, small):
        assert swap_held.survey(a).runs is None
    back, _ = crossed(dense, strided, small)
    for got, want in zip(back, (dense, strided, small), strict=True):
        assert np.array_equal(got, want)


def test_a_write_anywhere_changes_the_arrays_mark():
    """Catches an array taken as unchanged (not sent again, its rows never searched) after a
    write into a run that was all zeros, into one that was not, or after its runs moved (the
    same bytes kept in other places): the mark covers the runs kept and where they lie."""
    blocks = pool()
    before = swap_held.survey(blocks).mark
    blocks[300, 0, 0, 0] = 1.0  # a run of zeros written
    moved = swap_held.survey(blocks).mark
    blocks[300, 0, 0, 0] = 0.0
    assert swap_held.survey(blocks).mark == before
    blocks[5, 0, 0, 0] += 1.0  # a run already kept, rewritten
    rewritten = swap_held.survey(blocks).mark
    blocks[6], blocks[5] = blocks[5], 0.0  # the same bytes kept, one block further on
    assert len({before, moved, rewritten, swap_held.survey(blocks).mark}) == 4
    assert swap_held.survey(np.zeros((768, 12, 16, 64), dtype=np.float32)) is None


def hooked(description: dict, blobs: list[bytes]) -> bytes:
    header = {"outcome": "hooked", "probe": {"held": [description], "about": ""},
              "blob_sizes": [len(b) for b in blobs]}
    text = json.dumps(header).encode()
    return struct.pack("<I", len(text)) + text + b"".join(blobs)


def held(shape, kept: bytes, runs: bytes) -> bytes:
    return hooked({"dtype": "<f4", "shape": shape, "blob": 0, "bf16": False, "runs": 1},
                  [kept, runs])


RUN = bytes(RUN_BYTES)
FORGED = {
    # what the frame says wrong: the frame
    "fewer runs than the array has": held([FLOATS_A_RUN * 4], RUN, b"\x01\x00\x00"),
    "more runs than the array has": held([FLOATS_A_RUN * 2], RUN, b"\x01\x00\x00"),
    "a run said with a 2": held([FLOATS_A_RUN * 2], RUN, b"\x02\x00"),
    "kept bytes short of the runs said": held([FLOATS_A_RUN * 2], RUN, b"\x01\x01"),
    "kept bytes past the runs said": held([FLOATS_A_RUN * 2], RUN + RUN, b"\x01\x00"),
    "a runs blob past the blobs": hooked(
        {"dtype": "<f4", "shape": [FLOATS_A_RUN], "blob": 0, "runs": 5}, [RUN]),
    "a runs blob that is a string": hooked(
        {"dtype": "<f4", "shape": [FLOATS_A_RUN], "blob": 0, "runs": "1"}, [RUN, b"\x01"]),
    "an array of zeros past the reply limit": held(
        [MAX_REPLY_BYTES // 4 + FLOATS_A_RUN], b"", bytes(MAX_REPLY_BYTES // RUN_BYTES + 1)),
}


@pytest.mark.parametrize("name", FORGED)
def test_a_forged_runs_description_is_a_bad_reply(name):
    """Catches a frame that says runs the bytes do not hold decoded into an array (or raising
    out of the decoder), and one whose few bytes would make the grader allocate past the
    frame's limit (an array of zeros is counted at its whole size)."""
    outcome = decode_reply(FORGED[name])
    assert outcome.kind == "bad_reply", (outcome.kind, outcome.probe)


def test_a_true_runs_description_decodes():
    """Catches the checks above refusing what the worker really sends."""
    outcome = decode_reply(held([FLOATS_A_RUN * 2 + 1], RUN + b"\x00\x00\x80\x3f", b"\x01\x00\x01"))
    assert outcome.kind == "hooked", outcome.message
    (array,) = [s.array for s in outcome.probe["held"]]
    assert array.shape == (FLOATS_A_RUN * 2 + 1,) and array[-1] == 1.0 and not array[:-1].any()
