"""Decoding the student's replies is total: whatever bytes arrive on the reply pipe, the call
ends as an outcome (a malformed frame as `bad_reply` with a message), never as an exception in
the grader, and the run goes on to write its results."""

import io
import json
import random
import struct

import numpy as np
import pytest

from tests.test_hostile import grade, submission
from theinference.student.replies import MAX_NESTING, Foreign, decode_reply
from theinference.student.worker import worker


def frame(header: dict | bytes, blobs: list[bytes] = (), sizes=None) -> bytes:
    """A frame as decode_reply gets it (after the 8-byte length the pipe reader strips)."""
    if isinstance(header, dict):
        header = {**header, "blob_sizes": [len(b) for b in blobs] if sizes is None else sizes}
        header = json.dumps(header).encode()
    return struct.pack("<I", len(header)) + header + b"".join(blobs)


def worker_frame(reply: dict) -> bytes:
    """The frame the real worker writes for this reply, as the grader reads it."""
    out = io.BytesIO()
    worker.write_message(out, *worker.encode_reply(reply))
    return out.getvalue()[8:]


def returned(value_desc, blobs=(), sizes=None) -> bytes:
    return frame({"outcome": "returned", "value": value_desc}, list(blobs), sizes)


def array_desc(shape, dtype="<f4", blob=0) -> dict:
    return {"kind": "array", "dtype": dtype, "shape": shape, "blob": blob}


def nested(depth: int) -> bytes:
    return b'{"outcome": "returned", "value": ' + b"[" * depth + b"]" * depth + b"}"


def seq_chain(depth: int) -> dict:
    desc = {"kind": "none"}
    for _ in range(depth):
        desc = {"kind": "seq", "items": [desc]}
    return desc


FOUR_FLOATS = np.arange(4, dtype=np.float32).tobytes()
MALFORMED = {
    # what the frame does wrong: the frame
    "empty": b"",
    "a header length and nothing else": struct.pack("<I", 10),
    "header length past the end": struct.pack("<I", 1 << 31) + b"{}",
    "JSON nested 100000 deep": frame(nested(100_000)),
    "a value nested past the limit": returned(seq_chain(MAX_NESTING + 2)),
    "containers nested past the limit, under the interpreter's": frame(nested(200)),
    "header not JSON": frame(b"{not json"),
    "header not UTF-8": frame(b'{"outcome": "todo", "message": "\xff\xfe"}'),
    "header a list": frame(b'["outcome", "returned"]'),
    "header a string": frame(b'"returned"'),
    "header a number": frame(b"12"),
    "NaN in the header": frame(b'{"outcome": "todo", "message": NaN}'),
    "Infinity as a shape": frame(
        b'{"outcome": "returned", "value": {"kind": "array", "dtype": "<f4", "shape": [Infinity],'
        b' "blob": 0}, "blob_sizes": [16]}',
        [FOUR_FLOATS],
    ),
    "no outcome": frame({"message": "hi"}),
    "an outcome the worker never gives": frame({"outcome": "passed"}),
    "an outcome that is a list": frame({"outcome": ["returned"]}),
    "a message that is a dict": frame({"outcome": "raised", "message": {"a": 1}}),
    "blob sizes not a list": frame({"outcome": "todo"}, sizes=7),
    "a negative blob size": returned(array_desc([4]), [FOUR_FLOATS], sizes=[-16, 32]),
    "blob sizes past the end": returned(array_desc([4]), [FOUR_FLOATS], sizes=[1 << 40]),
    "blob sizes short of the end": returned(array_desc([2]), [FOUR_FLOATS], sizes=[8]),
    "a float blob size": returned(array_desc([4]), [FOUR_FLOATS], sizes=[16.0]),
    "a bool blob size": returned(array_desc([1], "|u1"), [b"\x01"], sizes=[True]),
    "a value that is not an object": returned([1, 2, 3]),
    "a value of an unknown kind": returned({"kind": "pickle", "data": "gASV"}),
    "a seq whose items are not a list": returned({"kind": "seq", "items": "abc"}),
    "a blob index past the blobs": returned(array_desc([4], blob=3), [FOUR_FLOATS]),
    "a negative blob index": returned(array_desc([4], blob=-1), [FOUR_FLOATS]),
    "a blob index that is a string": returned(array_desc([4], blob="0"), [FOUR_FLOATS]),
    "a shape that does not match the bytes": returned(array_desc([5]), [FOUR_FLOATS]),
    "a negative shape": returned(array_desc([-4]), [FOUR_FLOATS]),
    "a shape of floats": returned(array_desc([4.0]), [FOUR_FLOATS]),
    "a shape that is a number": returned(array_desc(4), [FOUR_FLOATS]),
    "a huge shape": returned(array_desc([1 << 62, 1 << 62]), [FOUR_FLOATS]),
    "a shape with 100 dimensions": returned(array_desc([1] * 99 + [4]), [FOUR_FLOATS]),
    "an object dtype": returned(array_desc([4], "|O"), [FOUR_FLOATS]),
    "a structured dtype": returned(array_desc([4], [["a", "<f4"]]), [FOUR_FLOATS]),
    "a datetime dtype": returned(array_desc([2], "<M8"), [FOUR_FLOATS]),
    "a dtype numpy does not know": returned(array_desc([4], "<f3"), [FOUR_FLOATS]),
    "two million lists": frame(b'{"outcome": "todo", "x": [' + b"[]," * 2_000_000 + b"[]]}"),
    "a header over the size limit": frame({"outcome": "raised", "message": "x" * (17 << 20)}),
    "an integer too long to read": frame(b'{"outcome": "todo", "message": 1' + b"0" * 5000 + b"}"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_frame_is_a_bad_reply(name):
    """Catches a frame that raises out of the decoder (RecursionError, OverflowError,
    AttributeError, ...) or that decodes into a value the worker could never have sent."""
    outcome = decode_reply(MALFORMED[name])
    assert outcome.kind == "bad_reply", (outcome.kind, outcome.value)
    assert outcome.message.startswith("unreadable reply from the student process: ")
    assert len(outcome.message) > len("unreadable reply from the student process: ")


def test_what_the_worker_writes_still_decodes():
    """Catches checks so strict that the worker's own frames (arrays of every kind it sends,
    per-layer pairs, foreign types, raised errors) turn into bad replies."""
    pairs = [(np.zeros((2, 3, 4), np.float32), np.ones((2, 3, 4), np.float64))] * 3
    value = [pairs, np.arange(5, dtype=np.int64), np.ones(2, bool), np.ones(2, np.complex64)]
    outcome = decode_reply(worker_frame({"outcome": "returned", "value": value, "probe": None}))
    assert outcome.kind == "returned", outcome.message
    (k, v), *_ = outcome.value[0]
    assert k.shape == (2, 3, 4) and v.dtype == np.float64 and v.sum() == 24
    assert outcome.value[1].tolist() == [0, 1, 2, 3, 4]
    assert outcome.value[2].dtype == bool and outcome.value[3].dtype.kind == "c"
    deepest = [[[[np.zeros((1, 1, 1, 1), object)]]]]  # described to the worker's depth limit
    assert decode_reply(worker_frame({"outcome": "returned", "value": deepest})).kind == "returned"
    text = decode_reply(worker_frame({"outcome": "returned", "value": "logits"}))
    assert text.value == Foreign("str")
    raised = {"outcome": "raised", "message": "boom", "traceback": "tb", "exception": "E"}
    got = decode_reply(worker_frame(raised))
    assert (got.kind, got.message, got.traceback, got.exception) == ("raised", "boom", "tb", "E")


def test_an_array_returned_in_several_places_is_sent_once():
    """Catches every reference to one array sent as a copy of its own: a cache whose layers
    share one grown array (a classic bug) returned as 12 (k, v) pairs was stacked into 24
    copies (its 300-token case 2.1 s against 0.75 s passing, on the pipe); and a list of
    distinct arrays, or of numbers, no longer one array."""
    from theinference.curriculum.checks.build_prefill import as_layer_pairs

    k, v = np.ones((12, 5, 64), np.float32), np.zeros((12, 5, 64), np.float32)
    _, blobs = worker.encode_reply({"outcome": "returned", "value": [(k, v)] * 12})
    assert sum(map(len, blobs)) == k.nbytes + v.nbytes, f"{len(blobs)} blobs sent"
    outcome = decode_reply(worker_frame({"outcome": "returned", "value": [(k, v)] * 12}))
    pairs = as_layer_pairs(outcome.value, 12)
    assert all(np.array_equal(a, k) and np.array_equal(b, v) for a, b in pairs)
    distinct = [(k.copy(), v.copy()) for _ in range(12)]
    _, blobs = worker.encode_reply({"outcome": "returned", "value": distinct})
    assert len(blobs) == 1, "a list of distinct arrays is no longer sent as one array"
    _, blobs = worker.encode_reply({"outcome": "returned", "value": [0, 0, 50256, 0]})
    assert len(blobs) == 1, "token ids (numbers, interned) are not arrays held twice"
    token = np.int64(50256)  # a NumPy scalar returned twice: a number, not an array
    header, _ = worker.encode_reply({"outcome": "returned", "value": [np.int64(5), token, token]})
    assert header["value"]["kind"] == "array", "token ids came back as a list of 0-d arrays"
    beside = [[0.5] * 5000, k, k]  # numbers beside a shared array: still one array, not cut
    header, blobs = worker.encode_reply({"outcome": "returned", "value": beside})
    first = header["value"]["items"][0]
    assert first["kind"] == "array" and first["shape"] == [5000] and len(blobs) == 2, first


def test_a_blob_named_past_the_reply_limit_is_a_bad_reply():
    """Catches a reply whose arrays name one blob again and again (a MiB named 1025 times: a
    GiB and more for whatever reads the arrays, from a frame of one MiB) decoded into a value:
    the bytes named in all are held to the frame's own limit."""
    from theinference.student.reply_arrays import MAX_REPLY_BYTES

    blob = bytes(1 << 20)
    many = {"kind": "seq", "items": [array_desc([1 << 18]) for _ in range(1025)]}
    assert MAX_REPLY_BYTES < 1025 << 20
    outcome = decode_reply(returned(many, [blob]))
    assert outcome.kind == "bad_reply" and "GiB" in outcome.message, outcome.message
    fewer = {"kind": "seq", "items": [array_desc([1 << 18]) for _ in range(24)]}
    assert decode_reply(returned(fewer, [blob])).kind == "returned"


def test_lone_surrogates_are_replaced_not_kept():
    """Catches text no output can encode (a lone surrogate) reaching the report writers."""
    header = b'{"outcome": "raised", "message": "a\\ud800b", "exception": "\\udfff"}'
    outcome = decode_reply(frame(header))
    assert outcome.kind == "raised"
    assert outcome.message == "a\ufffdb" and outcome.exception == "\ufffd"
    outcome.message.encode("utf-8")  # would raise on a surrogate


def test_random_damage_to_real_frames_never_escapes():
    """A fuzz: truncations, byte flips and spliced garbage of real frames. Catches any path
    through the decoder that raises instead of returning an outcome."""
    rng = random.Random(17)
    seeds = [
        worker_frame({"outcome": "returned", "value": [np.ones((3, 4), np.float32)] * 3}),
        worker_frame({"outcome": "raised", "message": "x", "traceback": "y", "exception": "E"}),
        worker_frame({"outcome": "returned", "value": [(np.ones(2), np.zeros(3))], "probe": {}}),
    ]
    kinds = set()
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            spot = rng.randrange(len(data))
            action = rng.random()
            if action < 0.4:
                data[spot] = rng.randrange(256)
            elif action < 0.6:
                del data[spot:]
            elif action < 0.8:
                data[spot:spot] = rng.choice([b"[", b"{", b"]", b"-1", b"1e999", b"NaN", b'"'])
            else:
                data[spot:spot] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
            if not data:
                data = bytearray(b"\0")
        outcome = decode_reply(bytes(data))
        assert outcome.kind in {"bad_reply", "returned", "raised"}
        kinds.add(outcome.kind)
    assert "bad_reply" in kinds


CRAFTED_FRAME = """import struct
    reply = os.fdopen(int(sys.argv[2]), "wb")  # the worker's reply pipe
    text = b'{"outcome": "returned", "value": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    reply.write(struct.pack("<QI", 4 + len(text), len(text)) + text)
    reply.flush()
    time.sleep(30)"""


def test_a_crafted_frame_from_the_students_process_is_its_cases_error(tmp_path):
    """The attack end to end: the student's code writes a frame nested 100000 deep to the
    reply descriptor. Catches a grader that dies with a traceback and writes no results."""
    course = submission(tmp_path, CRAFTED_FRAME)
    case, output, _ = grade(course, tmp_path)  # asserts no traceback and results written
    assert case["status"] == "error"
    assert "unreadable reply from the student process" in case["message"]
    assert "nested too deeply" in case["message"]
