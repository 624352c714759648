"""The two workers speak one protocol (theinference/student/worker/protocol.json): the same
requests, sent frame by frame to the Python worker and to the Node worker, get the same replies.

Each worker runs as the grader starts it (launch.worker_argv, no sandbox) on a fixture course of
its language (tests/fixtures/protocol/), copied into a throwaway folder with a throwaway HOME,
and is asked as the grader asks it: the adapter and hook spelled by the course's language object
(run_generate is runGenerate to the Node worker), the exception it reports read back through
it (a RangeError is the grader's ValueError, in its message too).
What is compared, per reply: the outcome, every field of the header, the value's description
(kind, dtype, shape, blob, length, items) and its arrays' bytes. Normalised, because the
languages differ and the grader reads them only for messages: the type names a value came
from ("from": ndarray/Float32Array; "other": str/string), a traceback (its text is each
language's own: compared as naming the student's adapters file), the words of a `missing` or
`signature` message, and a swap report's reason. A swap's written rows are compared to 1e-6
(the row's scale is float32 arithmetic in Python, float64 in Node).
"""

import json
import os
import select
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.test_typescript import NODE_MODULES
from theinference.course.directory import course_language
from theinference.curriculum.checks.swap import SwapPlan
from theinference.oracle.gpt2 import LayerKV
from theinference.student import launch
from theinference.student.channel import encode_frame
from theinference.student.replies import decode_reply, outcome_of, split_frame
from theinference.student.worker import protocol

# one worker runs this file: both workers (`workers`) serve every test here
pytestmark = pytest.mark.xdist_group("test_protocol_conformance")

FIXTURES = Path(__file__).parent / "fixtures" / "protocol"
WAIT = 60.0  # seconds for one reply: a cold Node with tsx on a loaded machine


class Worker:
    """One worker process, driven frame by frame through its two private pipes."""

    def __init__(self, course: Path, home: Path):
        req_read, self.requests = os.pipe()
        self.replies, resp_write = os.pipe()
        self.language = course_language(course)
        argv = launch.worker_argv(course, (req_read, resp_write), 2 << 30, self.language)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home)}
        self.stderr = open(home / "stderr", "wb")  # noqa: SIM115 (closed in close())
        self.popen = subprocess.Popen(
            argv, pass_fds=(req_read, resp_write), cwd=course, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
        )
        os.close(req_read)
        os.close(resp_write)
        self.words: list = []  # the hook words heard, in order

    def start(self) -> "Worker":
        assert self.frame()[0]["outcome"] == "ready"
        self.send({})  # the grader's go
        assert self.frame()[0]["outcome"] == "loaded", self.stderr_text()
        return self

    def send_raw(self, data: bytes) -> None:
        os.write(self.requests, data)

    def send(self, message) -> None:
        payload = json.dumps(message).encode()
        self.send_raw(protocol.LENGTH.pack(len(payload)) + payload)

    def read(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            ready, _, _ = select.select([self.replies], [], [], WAIT)
            assert ready, f"no reply within {WAIT} s: {self.stderr_text()}"
            chunk = os.read(self.replies, min(n - len(data), 1 << 20))
            if not chunk:
                break
            data += chunk
        return bytes(data)

    def payload(self) -> bytes | None:
        prefix = self.read(protocol.LENGTH.size)
        if len(prefix) < protocol.LENGTH.size:
            return None
        return self.read(protocol.LENGTH.unpack(prefix)[0])

    def frame(self) -> tuple[dict, list]:
        header, blobs = split_frame(self.payload())
        return header, [bytes(b) for b in blobs]

    def call(self, adapter: str, args: list, hook=None, answer=None) -> tuple[dict, list]:
        """The call's reply; a hook's words on the way answered by `answer(word)`. `adapter`
        and `hook` are the grader's names, sent as the course's language spells them."""
        spell = self.language.spelled
        hook = spell(hook) if hook else hook
        self.send({"adapter": spell(adapter), "args": args, "hook": hook, "watch": None})
        while True:
            header, blobs = self.frame()
            if header["outcome"] != "hooked":
                return header, blobs
            self.words.append(header["probe"])
            word = outcome_of(header, blobs).probe  # held arrays read back as the grader does
            os.write(self.requests, encode_frame(*answer(word)))

    def stderr_text(self) -> str:
        self.stderr.flush()
        return (Path(self.stderr.name)).read_text(errors="replace")[-2000:]

    def close(self) -> int:
        os.close(self.requests)
        try:
            status = self.popen.wait(timeout=WAIT)
        finally:
            if self.popen.poll() is None:
                self.popen.kill()
                self.popen.wait()
            os.close(self.replies)
            self.stderr.close()
        return status


@pytest.fixture(scope="module")
def courses(tmp_path_factory) -> dict[str, Path]:
    """Each language's fixture course in a throwaway folder (Node's runner linked in)."""
    root = tmp_path_factory.mktemp("protocol")
    out = {}
    for language in ("python", "ts"):
        out[language] = shutil.copytree(FIXTURES / language, root / language)
    (out["ts"] / "node_modules").symlink_to(NODE_MODULES)
    return out


def start_both(courses: dict[str, Path], home: Path):
    started = {}
    for language, course in courses.items():
        (home / language).mkdir()
        started[language] = Worker(course, home / language)
    for worker in started.values():
        worker.start()
    yield started
    for worker in started.values():
        if worker.popen.poll() is None:
            worker.close()


@pytest.fixture(scope="module")
def workers(courses, tmp_path_factory):
    """Both workers, serving every call of the module's tests that leaves them running."""
    yield from start_both(courses, tmp_path_factory.mktemp("home"))


@pytest.fixture
def fresh(courses, tmp_path):
    """Both workers, for a test that ends them."""
    yield from start_both(courses, tmp_path)


def normal(header: dict, blobs: list, language) -> dict:
    """The reply with what is each language's own taken out (see the module's text)."""
    out = {k: v for k, v in header.items() if k != "traceback"}
    if "traceback" in header:
        out["traceback"] = "tests/adapters." in header["traceback"]
    if header["outcome"] in ("missing", "signature"):
        out["message"] = "(the language's words)"
    if header.get("outcome") == "raised":  # the exception read back as the grader reads it
        out["exception"] = language.grader_exception(header["exception"])
        out["message"] = header["message"].replace(header["exception"], out["exception"])
    if "value" in header:
        out["value"] = described(header["value"], blobs)
    return out


def described(desc: dict, blobs: list):
    kind = desc["kind"]
    assert kind in protocol.KINDS, desc
    if kind == "array":
        dtype = np.dtype(desc["dtype"])
        return {**desc, "from": None, "bytes": blobs[desc["blob"]], "dtype": dtype.str}
    if kind == "seq":
        return {**desc, "items": [described(item, blobs) for item in desc["items"]]}
    return {"kind": kind}


def both(workers, adapter: str, args: list) -> dict:
    """The two workers' normalised replies to one call, checked equal."""
    replies = {lang: normal(*w.call(adapter, args), w.language) for lang, w in workers.items()}
    assert replies["python"] == replies["ts"], adapter
    return replies["python"]


VALUES = [
    None,
    3,
    -2.5,
    True,
    [1, 2, 3],
    [1, 2.5],
    [[1, 2], [3, 4]],
    [[1, 2], [3]],  # ragged: item by item
    [[[[[[7]]]]]],  # deeper than lists are described item by item: still one array
    [],
    [[], []],
    [True, False],
    [True, 2],
    "text",
    {"a": 1},
    [1, "a", None, [2.5, 3.5]],
    [[["deep", ["deeper", ["deepest"]]]]],  # past the depth lists are described to
]


def test_every_kind_of_value_is_described_the_same(workers):
    """Catches a worker that describes a value otherwise than its twin: another dtype (an
    integer read as a float, an empty list as float32, booleans as other), another shape, a
    ragged list not told item by item, a depth limit of its own."""
    for value in VALUES:
        reply = both(workers, "echo", [value])
        assert reply["outcome"] == "returned", value


def test_arrays_of_every_dtype_cross_byte_for_byte(workers):
    """Catches a typed array whose dtype or bytes differ between the workers, and a list of
    arrays not joined into one array the way NumPy joins them."""
    for constructor, dtype in protocol.SPEC["values"]["typed_arrays"].items():
        reply = both(workers, "typed", [constructor, dtype, [1, 2, 3]])
        assert reply["value"]["dtype"] == np.dtype(dtype).str, constructor
        assert np.frombuffer(reply["value"]["bytes"], dtype=dtype).tolist() == [1, 2, 3]
        both(workers, "pair", [constructor, dtype, [1, 2], [3, 4]])  # one [2, 2] array
        both(workers, "pair", [constructor, dtype, [1, 2], [3]])  # ragged: a seq


def test_the_item_limit_cuts_both_lists_alike(workers):
    """Catches a worker that describes more (or fewer) items than protocol.json's max_items,
    or loses the list's own length."""
    limit = protocol.LIMITS["max_items"]
    reply = both(workers, "echo", [["x"] * (limit + 5)])
    assert reply["value"]["length"] == limit + 5 and len(reply["value"]["items"]) == limit


def test_failures_in_student_code_are_told_alike(workers):
    """Catches outcomes that differ: an exception's type or message, a refusal not named
    ValueError, a stub not `todo`, a missing adapter or too few arguments not told as such,
    and a traceback that does not name the student's file."""
    raised = both(workers, "fail", [3])
    assert raised["outcome"] == "raised" and raised["message"] == "TypeError: bad ids 3"
    assert raised["traceback"] is True
    refused = both(workers, "run_generate", [[1], 2000])
    assert refused["exception"] == "ValueError"
    assert both(workers, "todo", [])["message"] == "stage two"
    assert both(workers, "no_such_adapter", [])["outcome"] == "missing"
    assert both(workers, "echo", [])["outcome"] == "signature"


def test_a_reply_past_the_header_limit_is_refused_from_both(workers):
    """Catches a worker whose oversized reply the grader would take (or one that cannot send
    it at all): a message past max_header_bytes is the grader's bad_reply from either."""
    size = protocol.LIMITS["max_header_bytes"] + 1
    for worker in workers.values():
        worker.send({"adapter": "fail", "args": ["x" * size], "hook": None, "watch": None})
        assert decode_reply(worker.payload()).kind == "bad_reply"


@pytest.mark.parametrize(
    "frame",
    [b"not json", b"[1, 2]", b'"\xff"', b'{"adapter": 3, "args": []}', b'{"adapter": "echo"}'],
)
def test_a_malformed_request_ends_both_workers_alike(fresh, frame):
    """Catches a worker that answers, or ends otherwise, on a request the grader never sends:
    not JSON, not an object, not UTF-8, no adapter name or no argument list."""
    for language, worker in fresh.items():
        worker.send_raw(protocol.LENGTH.pack(len(frame)) + frame)
        assert worker.payload() is None, language  # no reply: the pipe closed
        assert worker.close() == protocol.MALFORMED_EXIT, (language, worker.stderr_text())


def test_a_request_cut_short_ends_both_workers_quietly(fresh):
    """Catches a worker that fails loudly when the grader goes mid-request."""
    for language, worker in fresh.items():
        worker.send_raw(protocol.LENGTH.pack(100) + b'{"adapter"')
        assert worker.close() == 0, (language, worker.stderr_text())


@pytest.mark.parametrize("hooks", ["prefill,attnStep}); process.exit(0", None])
def test_the_node_worker_refuses_hook_names_it_cannot_paste(courses, hooks):
    """Catches the Node worker pasting a hook argument that is not identifiers into the code it
    generates, or starting without one (an old launcher's layout) and failing every cache-use
    proof as if the student's functions were missing: it ends, as on a malformed request."""
    course = courses["ts"]
    argv = launch.worker_argv(course, (0, 1), 2 << 30, course_language(course))
    argv = [*argv[:-1], hooks] if hooks is not None else argv[:-1]
    done = subprocess.run(argv, cwd=course, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=WAIT, env={"PATH": os.environ["PATH"]})
    assert done.returncode == protocol.MALFORMED_EXIT, done.stderr[-2000:]


# --- the swap: one rule, one tolerance, on both workers ------------------------------------

HEADS, HEAD_DIM, POSITIONS = 2, 16, 3


def unit(row: np.ndarray) -> np.ndarray:
    return row / np.linalg.norm(row)


def apart(row: np.ndarray, target: np.ndarray) -> float:
    """How far the row is from the target by the swap's rule: max |difference| at unit length."""
    return float(np.abs(unit(row.astype(np.float32)) - unit(target)).max())


def nudged(target: np.ndarray, distance: float) -> np.ndarray:
    """The target (float32 [hd]) with its direction moved by `distance`, by the swap's rule:
    its smallest value changed, so that scaling back to unit length moves the rest little."""
    j = int(np.argmin(np.abs(target)))
    step = distance * float(np.linalg.norm(target))
    for _ in range(4):  # the move is all but linear in the step: a few corrections settle it
        row = target.astype(np.float64).copy()
        row[j] += step
        step *= distance / apart(row, target)
    return row.astype(np.float32)


def swap_case(rng, case: str) -> tuple[list, SwapPlan]:
    """The cache's rows (keys kept pre-scaled by 1/8, values as they are; one row moved per
    `case`) and the grader's plan (the K/V to find, then to write)."""
    kv = {name: rng.standard_normal((HEADS, POSITIONS, HEAD_DIM)).astype(np.float32)
          for name in ("find_k", "find_v", "write_k", "write_v")}
    tol = protocol.TOLERANCE
    a, b = kv["find_v"][0, 0], kv["find_v"][0, 1]
    if case == "ambiguous":  # a row 0.25 tol from one target and 0.45 tol from another
        kv["find_v"][0, 1] = b = nudged(a, 0.7 * tol)
    rows = [row / 8 for row in kv["find_k"].reshape(-1, HEAD_DIM)]
    rows += list(kv["find_v"].reshape(-1, HEAD_DIM))
    moved = {"inside": 0.8 * tol, "outside": 1.25 * tol, "ambiguous": 0.25 * tol}[case]
    rows[HEADS * POSITIONS] = nudged(a, moved)
    if case == "ambiguous":
        assert apart(rows[HEADS * POSITIONS], b) < protocol.AMBIGUITY * moved
    finds = [LayerKV(k=kv["find_k"], v=kv["find_v"])]
    writes = [LayerKV(k=kv["write_k"], v=kv["write_v"])]
    return [r.tolist() for r in rows], SwapPlan("prefill", 1, finds, writes, None, None)


def held_shapes(word: dict) -> list:
    """A hook's word with what is each language's own taken out: the arrays it sent, by dtype
    and shape (the walk's description of them is worded by each worker)."""
    if "held" not in word:
        return word
    return sorted((d["dtype"], tuple(d["shape"]), d["bf16"]) for d in word["held"])


@pytest.mark.parametrize("case", ["inside", "outside", "ambiguous"])
def test_the_swap_is_one_exchange_on_both_workers(workers, case):
    """Catches workers that take part in the swap otherwise than the grader reads it: both send
    the same arrays (every row the cache keeps, as its own array) for the grader's one search,
    and write what it answers alike; a row moved by 0.8 of protocol.json's tolerance is found
    (and written at its scale), one moved by 1.25 of it is not, nor one that two targets lie
    near by less than the ambiguity factor, and then nothing is written; and neither worker
    is sent the K/V to find (the plan is sizes only)."""
    got = {}
    for language, worker in workers.items():
        worker.words.clear()
        rows, plan = swap_case(np.random.default_rng(7), case)
        answers = []

        def answer(word, plan=plan, answers=answers):
            answers.append(plan.answer(word))
            return answers[-1]

        header, out = worker.call("run_prefill", [rows], "prefill", answer)
        report = header["probe"]
        assert not answers[0][1] and set(answers[0][0]["swap"]) == set(protocol.SWAP_PLAN)
        got[language] = (
            [held_shapes(w) for w in worker.words],
            {k: report[k] for k in protocol.SPEC["hook"]["report"] if k != "swap"},
            {k: report["swap"].get(k) for k in ("applied", "places")},
            np.frombuffer(out[header["value"]["blob"]], dtype=np.float32).reshape(-1, HEAD_DIM),
            plan.sent,
        )
    (py_words, py_probe, py_swap, py_rows, py_sent), (ts_words, ts_probe, ts_swap, ts_rows,
                                                      ts_sent) = got.values()
    rows_held = [("<f4", (HEAD_DIM,), False)] * (2 * HEADS * POSITIONS)
    assert py_words == ts_words == [{"call": 1}, rows_held]
    assert py_probe == ts_probe == {"hook": "prefill", "calls": 1, "entered": 1, "found": 1}
    assert py_swap == ts_swap, (py_swap, ts_swap)
    assert py_swap["applied"] is py_sent is ts_sent is (case == "inside"), py_swap
    np.testing.assert_allclose(py_rows, ts_rows, rtol=1e-6, atol=1e-7)
    sent = np.asarray(rows, dtype=np.float32)
    if case == "inside":  # every row written: in the direction of the K/V to write
        writes = np.concatenate([plan.writes[0].k.ravel(), plan.writes[0].v.ravel()])
        wanted = [unit(w) for w in writes.reshape(-1, HEAD_DIM)]
        assert np.allclose([unit(r) for r in py_rows], wanted, atol=1e-5)
        np.testing.assert_allclose(py_rows[:HEADS * POSITIONS] * 8,
                                   plan.writes[0].k.reshape(-1, HEAD_DIM), rtol=1e-5, atol=1e-6)
    else:
        assert np.array_equal(py_rows, sent)  # nothing written
