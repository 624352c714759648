"""What the sandbox costs: start-up added per student process (bwrap against none), the
weights' per-load read and hash, and a whole `theinference test` run of the reference solution
in each mode (warm answer cache, so the oracle's share is small and the same in both).

    python benchmarks/sandbox_cost.py [--repeats 10] [--stage build-prefill ...] [--no-full]

Figures on a shared machine are noisy: the median of several start-ups is printed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import make_course, reference_text  # noqa: E402
from theinference.oracle import private_copy
from theinference.oracle.weights import load_weights  # noqa: E402
from theinference.student.process import StudentProcess  # noqa: E402
from theinference.student.sandbox import Sandbox, bwrap_problem, choose  # noqa: E402
from theinference.student.setup import Limits, ProcessSetup  # noqa: E402

MODES = ("bwrap", "none")


def startups(course: Path, weights: Path, kind: str, repeats: int) -> list[float]:
    """Seconds from launch to the worker's hello (interpreter and NumPy loaded), per process."""
    seconds = []
    for _ in range(repeats):
        with StudentProcess(ProcessSetup(
                course, weights, Limits(), sandbox=Sandbox(kind))) as process:
            assert process.call("run_step_attention", [[1, 2]]).kind == "returned"
            seconds.append(process.startup_seconds)
    return seconds


def full_run(course: Path, cache: Path, mode: str, stages: list[str]) -> dict:
    report = course.parent / f"run-{mode}.json"
    command = [sys.executable, "-m", "theinference", "test", "-C", str(course)]
    command += ["--sandbox", mode, "--timeout", "900", "--format", "json", "--output", str(report)]
    for slug in stages:
        command += ["--stage", slug]
    env = {**os.environ, "THEINFERENCE_CACHE_DIR": str(cache)}
    started = time.monotonic()
    subprocess.run(command, env=env, check=False, capture_output=True)
    data = json.loads(report.read_text())
    return {"wall": time.monotonic() - started, **data["timings"], "passed": data["passed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--stage", action="append", default=[])
    parser.add_argument("--no-full", action="store_true", help="start-ups only")
    args = parser.parse_args()
    if bwrap_problem():
        sys.exit(f"needs a working bubblewrap: {bwrap_problem()}")
    with tempfile.TemporaryDirectory() as tmp:
        course = make_course(Path(tmp) / "course", reference_text())
        cache = Path(tmp) / "cache"
        os.environ["THEINFERENCE_CACHE_DIR"] = str(cache)
        load_weights("synthetic", course)  # made once, outside the figures
        private_copy._LAST_READ.clear()  # a fresh grader process has no memo
        started = time.monotonic()
        weights = load_weights("synthetic", course)
        print(f"weights load (read and sha256 of 500 MB): {time.monotonic() - started:.2f} s")
        for mode in MODES:
            kind = choose(mode).kind
            figures = startups(course, weights.path, kind, args.repeats)
            print(
                f"start-up, {mode} ({kind}): median {statistics.median(figures):.3f} s, "
                f"min {min(figures):.3f} s over {len(figures)} processes"
            )
        if args.no_full:
            return
        full_run(course, cache, "none", args.stage)  # warm the answer cache
        for mode in MODES:
            t = full_run(course, cache, mode, args.stage)
            print(
                f"full run, {mode}: wall {t['wall']:.2f} s (grader total {t['total_seconds']:.2f}"
                f" s, student {t['student_seconds']:.2f} s, start-ups {t['worker_startups']} "
                f"taking {t['worker_startup_seconds']:.2f} s), passed={t['passed']}"
            )


if __name__ == "__main__":
    main()
