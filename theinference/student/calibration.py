"""This machine's float32 matrix-product rate, as the student's process would see it.

Measured in a fresh process started exactly like the student's (the same sandbox, limits and
worker, in its calibration mode, which never loads the student's code), timed from outside
with the same CPU measure as the student's calls: a fixed product of the shapes a GPT-2
forward multiplies, repeated, the best of a few tries. Under load both are slowed alike. A
TypeScript course multiplies through its provided kernel (src/kernel.ts, kernel.wasm,
kernel-fma.wasm), as its gpt2.ts does: measured only when those are the template's own, byte for
byte, with relaxed SIMD switched on (the kernel at its fastest, whatever flags the student's
process sets), and failed, never replaced, when the kernel does not load. An earlier
release's kernel is not trusted either (a slower kernel measured would make a more lenient
floor): the student is told to copy the current one.
"""

import hashlib

from theinference.course.languages import TEMPLATES, TYPESCRIPT, course_language
from theinference.student.process import StudentProcess

# [m, k] @ [k, n] repeated: an MLP product over a prompt (the TypeScript kernel is a few times
# slower than NumPy's BLAS: fewer repeats)
PRODUCTS = {"python": (512, 768, 3072, 6), "ts": (512, 768, 3072, 2)}
# what the TypeScript calibration multiplies with
KERNEL = ("src/kernel.ts", "src/kernel.wasm", "src/kernel-fma.wasm")
# SHA-256 of (kernel.ts, kernel.wasm) as earlier releases shipped them: named, not trusted
EARLIER_KERNELS = {
    ("18ab318646bb66b61f4db96d08469e19f3b203fb80558319899e642c11c69af0",
     "cb8df723f6500b0112ecde60bae10557092d7c459c5997e6200d919d300e60dd"),
    ("a703d9484cfabd7912e0ceec75cb32ba855c6a2f9ed6e6e9681d4266b63cc0e7",
     "be9b1b9371e58066d5976c21630bdf1ad26bdcedbf03f1417ff9a2f5c06a865b"),
    ("d40b5662fe1eac09015ea2dd021b92697e4e2d0f81fa6505d91ab0cc598c50ac",
     "be9b1b9371e58066d5976c21630bdf1ad26bdcedbf03f1417ff9a2f5c06a865b"),
}
TRIES = 3
TIMEOUT = 120.0

def rate_now(process: StudentProcess) -> tuple[float | None, str]:
    """(FLOP per CPU-second, "") for the process's course and sandbox, measured afresh now:
    beside a measured call, under the load that call will meet (benchmarks/floor_spread.py);
    (None, why) when it could not be measured."""
    return measure(process)


def measure(process: StudentProcess) -> tuple[float | None, str]:
    language = course_language(process.course_dir)
    if language == TYPESCRIPT and (changed := kernel_changed(process)):
        if earlier_kernel(process):
            return None, (
                "src/kernel.ts and kernel.wasm are an earlier release's: copy src/kernel.ts, "
                "kernel.wasm, kernel-fma.wasm and kernel.wat from a course made by "
                "`theinference init --lang ts` "
                "(the floor is measured only with the current kernel)"
            )
        return None, f"{changed} is not the provided one: the rate it gives cannot be trusted"
    m, k, n, repeat = PRODUCTS.get(language, PRODUCTS["python"])
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
    for name in KERNEL:
        provided = (TEMPLATES[TYPESCRIPT] / name).read_bytes()
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
            for name in KERNEL[:2]
        )
    except OSError:
        return False
    return digests in EARLIER_KERNELS
