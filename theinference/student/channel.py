"""Reading one reply from the student's process: the reply pipe framed by its length, stdout
and stderr captured beside it (capped), the deadline, a cancel from another thread and the
watchdog's limits checked every 50 ms. The request pipe is written meanwhile, as it takes the
bytes (a process that stops reading cannot block the grader), and a cache-use hook's word
(`hooked`, sent mid-call by the worker's probes.py) is answered on the way."""

import json
import os
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theinference.student.replies import Captured, Outcome, decode_reply
from theinference.student.reply_arrays import MAX_REPLY_BYTES
from theinference.student.worker import protocol

POLL_SECONDS = 0.05
# hooked calls in one adapter call (a 1024-token walk makes 1024)
MAX_HOOK_WORDS = protocol.LIMITS["max_hook_words"]
TOO_BIG = "too big"

HookAnswer = Callable[[dict], tuple[dict, list[bytes]]]  # a hook's word -> (header, blobs)


def no_swap(word: dict) -> tuple[dict, list[bytes]]:
    """A hook's answer on every call that is not a probe: carry on, and do not ask again."""
    return {"swap": None, "next": None}, []


@dataclass(frozen=True)
class Probe:
    """What a call watches for: `hook`, a course function whose every return is told to the
    grader, which answers with `answer` (by default, carry on: no_swap); `watch` "returns":
    any return after the prompt's prefill is told (worker/probes.py); `swapped`: whether the
    grader has sent the swap's writes (from then on the answer over the swap is the call's
    evidence, and a CPU limit on it is lifted: measured.measured_call)."""

    hook: str | None = None
    watch: str | None = None
    answer: HookAnswer | None = None
    swapped: Callable[[], bool] | None = None


NO_PROBE = Probe()


@dataclass(frozen=True)
class Ends:
    """What ends a wait besides the reply: the deadline, the run's cancel (set from another
    thread), a watchdog's breach, the worker's death (`crashed()` says how)."""

    deadline: float
    cancel: object
    watchdog: object
    crashed: Callable


ANSWERING = 3


def collect(proc, ends: Ends, output_cap: int, on_hook: HookAnswer = no_swap) -> Outcome:
    """The next reply on proc's pipe (decoded), or the outcome that ended the wait (`ends`), a
    reply too large to take or a flood of hook words."""
    deadline, crashed = ends.deadline, ends.crashed
    # the grader's answering time the call is not charged, at most ANSWERING timeouts more
    spare = ANSWERING * max(deadline - time.monotonic(), 0.0)
    out, err = Captured(), Captured()
    reply = Incoming()
    words = 0  # hook words answered in this call
    sel = selectors.DefaultSelector()
    sel.register(proc.replies, selectors.EVENT_READ, "reply")
    sel.register(proc.popen.stdout, selectors.EVENT_READ, out)
    sel.register(proc.popen.stderr, selectors.EVENT_READ, err)
    try:
        while True:
            frame = reply.next_frame()
            if isinstance(frame, Outcome) and frame.kind == "hooked":
                words += 1
                if words > MAX_HOOK_WORDS or len(proc.outgoing) > MAX_REPLY_BYTES:
                    flood = f"over {MAX_HOOK_WORDS} hooked calls, or their answers unread"
                    return finish(Outcome("bad_reply", message=flood), out, err)
                asked = time.monotonic()
                proc.outgoing += encode_frame(*on_hook(frame.probe or {}))
                # the process waited on the grader's answer (a search, a plan still made):
                # not its time
                waited = min(time.monotonic() - asked, spare)
                deadline, spare = deadline + waited, spare - waited
                continue
            if isinstance(frame, Outcome):
                drain(sel, out, err, output_cap)
                return finish(frame, out, err)
            if frame == TOO_BIG:
                too_big = Outcome("bad_reply", message="the return value is over 1 GiB")
                return finish(too_big, out, err)
            stopped = stop_reason(deadline, ends.cancel, ends.watchdog)
            if stopped is not None:
                return finish(stopped, out, err)
            if not read_some(proc, sel, deadline, output_cap, reply):
                return finish(crashed(), out, err)  # the worker died before replying
    finally:
        sel.close()


def read_some(proc, sel, deadline: float, output_cap: int, reply: "Incoming") -> bool:
    """One wait on the pipes (at most POLL_SECONDS): the request written as far as the pipe
    takes it, output captured, reply bytes added. False when the reply pipe has closed."""
    want_writing(sel, proc)
    for key, _ in sel.select(min(max(deadline - time.monotonic(), 0), POLL_SECONDS)):
        if key.data == "request":
            write_some(proc)
        elif key.data == "reply":
            if not reply.read(key.fd):
                return False
        elif chunk := os.read(key.fd, 1 << 20):
            key.data.add(chunk, output_cap)
        else:
            sel.unregister(key.fileobj)
    return True


OWN_BUFFER = 1 << 20  # bytes: a frame this large is read into memory of its own size


class Incoming:
    """The reply pipe's bytes, cut into frames (each its length, then its payload). A large
    frame (the arrays a swap's moment sends, up to hundreds of MB) is read straight into one
    buffer of its size, never grown or copied: on a machine that gives memory back to its host
    while idle, every page first touched costs tens of microseconds."""

    def __init__(self):
        self.pending = bytearray()  # bytes read and not yet framed
        self.body: np.ndarray | None = None  # [size] uint8: a large frame's payload, filling
        self.filled = 0  # its bytes read so far

    def read(self, fd: int) -> bool:
        """The bytes the pipe has now, at most 1 MiB; False when it has closed."""
        if self.body is None:
            chunk = os.read(fd, 1 << 20)
            self.pending += chunk
            return bool(chunk)
        with memoryview(self.body) as view:
            got = os.readv(fd, [view[self.filled : self.filled + (1 << 20)]])
        self.filled += got
        return bool(got)

    def next_frame(self):
        """The first whole frame's payload, decoded; TOO_BIG for a frame over the cap; None
        while it is incomplete."""
        if self.body is None and not self.framed():
            return self.small_frame()
        if self.body is None or self.filled < len(self.body):
            return None
        payload, self.body = memoryview(self.body).toreadonly(), None
        return decode_reply(payload)

    def framed(self) -> bool:
        """Whether the pending bytes begin a frame of OWN_BUFFER or more under the cap: then
        its payload is moved to a buffer of its own size, where the rest is read."""
        size = self.size()
        if size is None or not OWN_BUFFER <= size <= MAX_REPLY_BYTES:
            return False
        try:
            self.body = np.empty(size, dtype=np.uint8)  # (untouched until read into)
        except MemoryError:  # no room for it at once: gathered as it comes, as a small one
            return False
        start = protocol.LENGTH.size
        self.filled = min(len(self.pending) - start, size)
        self.body[: self.filled] = np.frombuffer(self.pending, np.uint8, self.filled, start)
        del self.pending[: start + self.filled]
        return True

    def size(self) -> int | None:
        """The pending frame's payload size, once its length has come whole."""
        start = protocol.LENGTH.size
        return None if len(self.pending) < start else protocol.LENGTH.unpack_from(self.pending)[0]

    def small_frame(self):
        start, size = protocol.LENGTH.size, self.size()
        if size is None:
            return None
        if size > MAX_REPLY_BYTES:
            return TOO_BIG
        if len(self.pending) < start + size:
            return None
        payload = bytes(self.pending[start : start + size])
        del self.pending[: start + size]
        return decode_reply(payload)


def want_writing(sel, proc) -> None:
    """Watch the request pipe for room while there is something to write to it."""
    registered = proc.requests in {k.fd for k in sel.get_map().values()}
    if proc.outgoing and not registered:
        sel.register(proc.requests, selectors.EVENT_WRITE, "request")
    elif not proc.outgoing and registered:
        sel.unregister(proc.requests)


def write_some(proc) -> None:
    try:
        written = os.write(proc.requests, proc.outgoing[: 1 << 16])
    except BlockingIOError:
        return
    except OSError:  # it died: the reply pipe's end says how
        written = len(proc.outgoing)
    del proc.outgoing[:written]


def encode_frame(header: dict, blobs: list[bytes]) -> bytes:
    """The reply framing (length, JSON length, JSON, blobs), for a hook's answer."""
    text = json.dumps({**header, protocol.BLOB_SIZES: [len(b) for b in blobs]}).encode()
    size = protocol.HEADER_LENGTH.size + len(text) + sum(map(len, blobs))
    head = protocol.REPLY_HEAD.pack(size, len(text))
    return b"".join([head, text, *blobs])


def stop_reason(deadline: float, cancel, watchdog) -> Outcome | None:
    """Why the wait must end now, if it must."""
    if deadline - time.monotonic() <= 0:
        return Outcome("timeout")
    if cancel.is_set():
        return Outcome("cancelled")
    if watchdog is not None and (breach := watchdog.poll()) is not None:
        outcome = Outcome(breach.kind, message=breach.message)
        outcome.cpu_seconds = breach.cpu_seconds  # read before the kill
        return outcome
    return None


def drain(sel, out: Captured, err: Captured, output_cap: int) -> None:
    # output written before the reply is already in the pipes: take what is there now
    for key, _ in sel.select(0):
        if key.data not in ("reply", "request"):
            chunk = os.read(key.fd, 1 << 20)
            if chunk:
                key.data.add(chunk, output_cap)


def finish(outcome: Outcome, out: Captured, err: Captured) -> Outcome:
    outcome.stdout, outcome.stderr = out.text(), err.text()
    return outcome
