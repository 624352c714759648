"""Reading one reply from the student's process: the reply pipe framed by its length, stdout
and stderr captured beside it (capped), the deadline, a cancel from another thread and the
watchdog's limits checked every 50 ms."""

import os
import selectors
import struct
import time
from collections.abc import Callable

from theinference.student.replies import MAX_REPLY_BYTES, Captured, Outcome, decode_reply

POLL_SECONDS = 0.05


def collect(proc, deadline: float, cancel, watchdog, output_cap: int, crashed: Callable) -> Outcome:
    """The next reply on proc's pipe (decoded), or the outcome that ended the wait: timeout,
    cancelled, a watchdog's breach, the worker's death (`crashed()` says how) or a reply too
    large to take."""
    out, err = Captured(), Captured()
    reply = bytearray()
    need: int | None = None
    sel = selectors.DefaultSelector()
    sel.register(proc.replies, selectors.EVENT_READ, "reply")
    sel.register(proc.popen.stdout, selectors.EVENT_READ, out)
    sel.register(proc.popen.stderr, selectors.EVENT_READ, err)
    try:
        while need is None or len(reply) < need:
            stopped = stop_reason(deadline, cancel, watchdog)
            if stopped is not None:
                return finish(stopped, out, err)
            for key, _ in sel.select(min(max(deadline - time.monotonic(), 0), POLL_SECONDS)):
                chunk = os.read(key.fd, 1 << 20)
                if key.data != "reply":
                    if chunk:
                        key.data.add(chunk, output_cap)
                    else:
                        sel.unregister(key.fileobj)
                    continue
                if not chunk:  # the worker died before replying
                    return finish(crashed(), out, err)
                reply += chunk
                if need is None and len(reply) >= 8:
                    need = 8 + struct.unpack("<Q", reply[:8])[0]
                    if need > MAX_REPLY_BYTES:
                        too_big = Outcome("bad_reply", message="the return value is over 1 GiB")
                        return finish(too_big, out, err)
        drain(sel, out, err, output_cap)
        return finish(decode_reply(bytes(reply[8:need])), out, err)
    finally:
        sel.close()


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
        if key.data != "reply":
            chunk = os.read(key.fd, 1 << 20)
            if chunk:
                key.data.add(chunk, output_cap)


def finish(outcome: Outcome, out: Captured, err: Captured) -> Outcome:
    outcome.stdout, outcome.stderr = out.text(), err.text()
    return outcome
