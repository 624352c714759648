"""Does the speed figure rank caches right while the machine is busy? The reference solution
and a correct but slower cache (tests/solutions/slow_cache.py: the whole cache copied at
every layer of every step) are timed against the oracle's yardstick, as `grade` does with
`[grading] speed = true`, several times while another grading job loads the machine.

    python benchmarks/speed_ranking.py [--runs 5] [--repeats 3] [--sandbox auto] [--no-load]

Prints each run's figures (ratio to the oracle's decode step at a 512-token context, tokens
per CPU second, milliseconds per step), whether the ranking was right, and the spread.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import make_course, reference_text  # noqa: E402
from tests.solutions.slow_cache import slow_cache_text  # noqa: E402
from theinference.grading.speed import speed_of  # noqa: E402
from theinference.oracle.weights import load_weights  # noqa: E402
from theinference.student.sandbox import choose  # noqa: E402
from theinference.student.setup import Limits, ProcessSetup  # noqa: E402


def load_job(root: Path) -> subprocess.Popen:
    """Another grading job, over and over: a class of two reference submissions, every stage,
    one at a time (the machine's other core stays for the figure being taken)."""
    subs = root / "load-submissions"
    for sid in ("load-a", "load-b"):
        make_course(subs / sid, reference_text())
    script = (f"while true; do {sys.executable} -m theinference grade {subs} "
              f"--out {root / 'load-results'} --jobs 1 >/dev/null 2>&1; "
              f"rm -rf {root / 'load-results'}; done")
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def one_run(courses: dict[str, Path], weights, sandbox: str, repeats: int) -> dict[str, dict]:
    return {
        name: speed_of(ProcessSetup(course, weights.path, Limits(timeout=300),
                                    sandbox=choose(sandbox, course)), weights, repeats=repeats)
        for name, course in courses.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sandbox", default="auto")
    parser.add_argument("--no-load", action="store_true")
    args = parser.parse_args()
    weights = load_weights("synthetic", Path("."))
    root = Path(tempfile.mkdtemp(prefix="theinference-speed-"))
    courses = {"reference": make_course(root / "reference", reference_text()),
               "slow-cache": make_course(root / "slow", slow_cache_text())}
    load = None if args.no_load else load_job(root)
    ratios: dict[str, list[float]] = {name: [] for name in courses}
    right = 0
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            got = one_run(courses, weights, args.sandbox, args.repeats)
            for name, speed in got.items():
                if speed["status"] != "measured":
                    print(f"run {run} {name}: {speed['status']}: {speed['reason']}")
                    continue
                ratios[name].append(speed["ratio"])
                print(f"run {run} {name:10s} ratio {speed['ratio']:.3f}  "
                      f"decode {speed['decode_ms']:.1f} ms (oracle {speed['oracle_decode_ms']:.1f})"
                      f"  {speed['tokens_per_cpu_second']:.1f} tok/CPU-s "
                      f"(oracle {speed['oracle_tokens_per_cpu_second']:.1f})", flush=True)
            ok = all(g["status"] == "measured" for g in got.values()) and (
                got["reference"]["ratio"] > got["slow-cache"]["ratio"])
            right += ok
            print(f"run {run}: ranked {'right' if ok else 'WRONG'} "
                  f"({time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.1f})",
                  flush=True)
    finally:
        if load is not None:
            os.killpg(load.pid, 9)
            load.wait()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nranked right in {right} of {args.runs} runs"
          + ("" if args.no_load else " with another grading job running"))
    for name, values in ratios.items():
        if values:
            print(f"{name:10s} ratio median {statistics.median(values):.3f}, "
                  f"min {min(values):.3f}, max {max(values):.3f} over {len(values)} runs")


if __name__ == "__main__":
    main()
