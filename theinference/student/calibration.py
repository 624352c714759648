"""This machine's float32 matrix-product rate, as the student's process would see it.

Measured in a fresh process started exactly like the student's (the same sandbox, limits and
worker, in its calibration mode, which never loads the student's code and starts without site
processing: launch.py), timed from outside
with the same CPU measure as the student's calls: a fixed product of the shapes a GPT-2
forward multiplies, repeated, the best of a few tries. Under load both are slowed alike. A
TypeScript course multiplies through its provided kernel (src/kernel.ts, kernel.wasm,
kernel-fma.wasm), as its gpt2.ts does: measured only when those are the template's own, byte for
byte, with relaxed SIMD switched on (the kernel at its fastest, whatever flags the student's
process sets), and failed, never replaced, when the kernel does not load. An earlier
release's kernel is not trusted either (a slower kernel measured would make a more lenient
floor): the student is told to copy the current one. Where the student's process can write the
grader's installation (reach.py), nothing is measured: the rate could be its.
"""

import hashlib
import threading
import time
from typing import Protocol

from theinference.student import reach
from theinference.student.process import StudentProcess

TRIES = 3
TIMEOUT = 120.0
FRESH_FOR = 60.0  # seconds a rate serves a floor's verdict
# seconds a rate serves what decides no verdict: a try's CPU budget (a try stopped by it is
# measured alone, under a rate FRESH_FOR old) and the cost said beside a pass the swap proves.
# A student's saves are often more than a minute apart; measuring again for each cost a
# second of CPU beside the stage's longest case (benchmarks/save_speed.py)
BOUNDS_FOR = 900.0


def rate_now(process: StudentProcess, fresh_for: float = FRESH_FOR) -> tuple[float | None, str]:
    """(FLOP per CPU-second, "") for the process's course and sandbox, measured now: beside a
    measured call, under the load that call will meet (benchmarks/floor_spread.py), or
    within the last `fresh_for` seconds, for the same course, sandbox and language, by this
    grader or, where the run keeps rates (`setup.rates`), by an earlier run of its cache (a
    stage's measured calls follow each other, and a student's runs a save apart: CPU time, which
    the floors compare, barely moves with the load in so short a time); (None, why) when it
    could not be. A floor's verdict takes FRESH_FOR; what decides no verdict may take longer
    (BOUNDS_FOR)."""
    if (refused := untrusted(process)) is not None:  # asked every time: files change
        return None, refused
    key = rate_key(process)
    kept = _MEASURED.get(key)
    if kept is not None and time.monotonic() - kept[0] < fresh_for:
        return kept[1], ""
    memo: RateMemo | None = process.setup.rates  # by an earlier run of this cache, if trusted
    if memo is not None and (known := memo.known(key, fresh_for)) is not None:
        return known, ""
    rate, why = measure(process)
    if rate is not None:
        _MEASURED[key] = (time.monotonic(), rate)
        if memo is not None:
            memo.learn(key, rate)
    return rate, why


class RateMemo(Protocol):
    """Rates kept across runs (grading/digests.py's SignedRates: only where the student's
    process can neither read nor write the grader's cache)."""

    def known(self, key: tuple, fresh_for: float) -> float | None: ...

    def learn(self, key: tuple, rate: float) -> None: ...


def rate_key(process: StudentProcess) -> tuple:
    """What a rate is measured for: the course, its sandbox and its language."""
    sandbox = process.setup.sandbox
    return str(process.course_dir), sandbox.kind if sandbox else None, process.language.name


def rate_soon(process: StudentProcess, in_thread: bool, fresh_for: float = FRESH_FOR) -> "RateSoon":
    """rate_now's rate (within `fresh_for`), measured in a thread from now (RateSoon) where
    `in_thread` (where the grader's BLAS has threads of its own, a process started beside it
    may hang: then now, in the caller's); a measure still under way for the same course and
    freshness is shared (a stage's calls beside each other ask at once)."""
    key = (*rate_key(process), fresh_for)
    with _SOON_LOCK:  # held only to pick the measure: another course's is not kept waiting
        soon = _SOON.get(key)
        begun = soon is None or soon.done.is_set()
        if begun:
            soon = _SOON[key] = RateSoon(fresh_for)
    if begun:
        soon.begin(process, in_thread)
    return soon


class RateSoon:
    """rate_now's rate, measured in a thread of its own from now, so that a call whose CPU
    budget needs it does not wait for it: `known()` is the rate once measured (None before,
    and where none could be had); `wait()` waits for it."""

    def __init__(self, fresh_for: float = FRESH_FOR):
        self.rate: float | None = None
        self.fresh_for = fresh_for
        self.done = threading.Event()

    def begin(self, process: StudentProcess, in_thread: bool) -> None:
        if not in_thread:
            self.measure(process)
            return
        threading.Thread(target=self.measure, args=(process,), daemon=True,
                         name="theinference-rate").start()

    def measure(self, process: StudentProcess) -> None:
        try:
            self.rate, _ = rate_now(process, self.fresh_for)
        finally:
            self.done.set()

    def known(self) -> float | None:
        return self.rate if self.done.is_set() else None

    def wait(self) -> float | None:
        self.done.wait()
        return self.rate


_MEASURED: dict[tuple, tuple[float, float]] = {}  # key -> (when, rate), this grader's own
_SOON: dict[tuple, RateSoon] = {}  # key -> the last measure begun in a thread
_SOON_LOCK = threading.Lock()


def untrusted(process: StudentProcess) -> str | None:
    """Why no rate measured for this course could be trusted, if one could not."""
    language = process.language
    if language.provided_kernel and (changed := kernel_changed(process)):
        if earlier_kernel(process):
            return (
                "src/kernel.ts and kernel.wasm are an earlier release's: copy src/kernel.ts, "
                "kernel.wasm, kernel-fma.wasm and kernel.wat from a course made by "
                f"`theinference init --lang {language.name}` "
                "(the floor is measured only with the current kernel)"
            )
        return f"{changed} is not the provided one: the rate it gives cannot be trusted"
    if process.install_reach:  # a .pth file or a changed NumPy would run in it
        return reach.why(process.install_reach)
    return None


def measure(process: StudentProcess) -> tuple[float | None, str]:
    """The rate measured afresh, in a sibling process (or why it cannot be trusted)."""
    if (refused := untrusted(process)) is not None:
        return None, refused
    m, k, n, repeat = process.language.calibration
    flop = 2.0 * m * k * n * repeat
    best = 0.0
    with process.sibling("calibrate") as calibrating:
        for _ in range(TRIES):
            outcome = calibrating.call("sgemm", [m, k, n, repeat], TIMEOUT)
            if outcome.kind != "returned" or outcome.cpu_seconds is None:
                return None, f"the calibration failed: {outcome.message or outcome.kind}"
            best = max(best, flop / max(outcome.cpu_seconds, 0.01))
    return best, ""


def kernel_changed(process: StudentProcess) -> str | None:
    """The first of the course's kernel files that differs from the template's, if any."""
    for name in process.language.provided_kernel:
        provided = (process.language.template / name).read_bytes()
        try:
            if (process.course_dir / name).read_bytes() != provided:
                return name
        except OSError:
            return name
    return None


def earlier_kernel(process: StudentProcess) -> bool:
    """Whether the course's kernel.ts and kernel.wasm are, as a pair, the ones an earlier
    release shipped."""
    try:
        digests = tuple(
            hashlib.sha256((process.course_dir / name).read_bytes()).hexdigest()
            for name in process.language.provided_kernel[:2]
        )
    except OSError:
        return False
    return digests in process.language.earlier_kernels
