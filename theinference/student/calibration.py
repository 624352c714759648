"""This machine's float32 matrix-product rate, as the student's process would see it.

Measured in a fresh process started exactly like the student's (the same sandbox, limits and
worker, in its calibration mode, which never loads the student's code), timed from outside
with the same CPU measure as the student's calls: a fixed product of the shapes a GPT-2
forward multiplies, repeated, the best of a few tries. Under load both are slowed alike.
"""

import weakref

from theinference.course.languages import course_language
from theinference.student.process import StudentProcess

# [m, k] @ [k, n] repeated: an MLP product over a prompt; the TypeScript worker's is plain
# JavaScript, as the provided gpt2.ts's, many times slower than NumPy's: a smaller one
PRODUCTS = {"python": (512, 768, 3072, 6), "ts": (32, 768, 3072, 2)}
TRIES = 3
TIMEOUT = 120.0

_rates: "weakref.WeakKeyDictionary[StudentProcess, tuple[float | None, str]]"
_rates = weakref.WeakKeyDictionary()


def sgemm_rate(process: StudentProcess) -> tuple[float | None, str]:
    """(FLOP per CPU-second, "") for the process's course and sandbox, measured once per
    process; (None, why) when it could not be measured."""
    if process not in _rates:
        _rates[process] = measure(process)
    return _rates[process]


def measure(process: StudentProcess) -> tuple[float | None, str]:
    m, k, n, repeat = PRODUCTS.get(course_language(process.course_dir), PRODUCTS["python"])
    flop = 2.0 * m * k * n * repeat
    best = 0.0
    with process.sibling("calibrate") as calibrating:
        for _ in range(TRIES):
            outcome = calibrating.call("sgemm", [m, k, n, repeat], TIMEOUT)
            if outcome.kind != "returned" or outcome.cpu_seconds is None:
                return None, f"the calibration failed: {outcome.message or outcome.kind}"
            best = max(best, flop / max(outcome.cpu_seconds, 0.01))
    return best, ""
