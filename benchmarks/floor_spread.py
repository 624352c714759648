"""How far the floors' matrix-product rate moves, on a quiet machine and under load, and how far
the bound moves when the rate is measured beside the work it judges.

    python benchmarks/floor_spread.py [--runs 10] [--busy 4] [--sandbox auto]

The rate is measured as a grading run measures it (student/calibration.py: a fresh process
started like the student's, best of a few products, CPU time read from outside), `--runs`
times on the machine as it is, then as many times beside `--busy` processes spinning. Each
time, a stand-in for the student's measured call (a product of other shapes, in a fresh process
of its own) follows at once; its CPU time against what the rate predicts for it is the bound's
own figure. Printed: min, median and max of the rate and the spread (max / min), and the
spread of that figure when the rate is the run's first (one calibration per run, as before)
and when it is measured just before each call (as measured calls now are).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from theinference.student import calibration, sandbox
from theinference.student.process import StudentProcess
from theinference.student.setup import Limits, ProcessSetup

STAND_IN = (960, 768, 2304, 4)  # [m, k] @ [k, n] repeated: a forward's QKV products, say
SPIN = "while True: pass"


def stand_in_seconds(process: StudentProcess) -> float | None:
    """The CPU time of the stand-in call, in a fresh calibration-mode process."""
    m, k, n, repeat = STAND_IN
    with process.sibling("calibrate") as fresh:
        outcome = fresh.call("sgemm", [m, k, n, repeat], calibration.TIMEOUT)
    return outcome.cpu_seconds if outcome.kind == "returned" else None


def sample(process: StudentProcess, runs: int) -> list[tuple[float, float]]:
    """(rate, stand-in CPU seconds) measured back to back, `runs` times."""
    found = []
    for _ in range(runs):
        rate, why = calibration.measure(process)
        seconds = stand_in_seconds(process)
        if rate is None or seconds is None:
            sys.exit(f"the calibration failed: {why or 'the stand-in call failed'}")
        found.append((rate, seconds))
    return found


def spread(values: list[float]) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"min {low:.3g}  median {mid:.3g}  max {high:.3g}  spread {high / low:.2f}x"


def report(label: str, pairs: list[tuple[float, float]], first_rate: float) -> None:
    m, k, n, repeat = STAND_IN
    flop = 2.0 * m * k * n * repeat
    rates = [rate / 1e9 for rate, _ in pairs]
    print(f"{label}: rate GFLOP per CPU-second  {spread(rates)}")
    # the bound's figure: the call's CPU time over what the rate says it needs (1.0: exact)
    once = [seconds / (flop / first_rate) for _, seconds in pairs]
    beside = [seconds / (flop / rate) for rate, seconds in pairs]
    print(f"  call / floor, one rate per run:      {spread(once)}")
    print(f"  call / floor, rate just before each: {spread(beside)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=4)
    parser.add_argument("--sandbox", default="auto", choices=sandbox.MODES)
    options = parser.parse_args()
    from tests.helpers import make_course, reference_text

    course = make_course(Path(tempfile.mkdtemp()) / "course", reference_text())
    chosen = sandbox.choose(options.sandbox)
    weights = Path("/nonexistent.safetensors")  # the calibration reads no weights
    with StudentProcess(ProcessSetup(course, weights, Limits(), sandbox=chosen)) as process:
        print(f"sandbox {process.sandbox}, CPU account {process.cpu_account}")
        quiet = sample(process, options.runs)
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(options.busy)]
        try:
            loaded = sample(process, options.runs)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    first = quiet[0][0]
    report("quiet", quiet, first)
    report(f"beside {options.busy} busy processes", loaded, first)
    report("both", quiet + loaded, first)


if __name__ == "__main__":
    main()
