"""Save -> verdict latency of `theinference test --watch`, and how much of it is the grader.

Starts the watcher on a course holding the reference solution, then edits src/kvcache.py
(a real content change) several times, timing each save until the verdict line appears. The
student's own compute time comes from the run's JSON timings; the rest is the grader's
(file-event debounce, worker start-up, oracle from cache, report).

    python benchmarks/watch_latency.py [--stage build-prefill] [--saves 8]
"""

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import make_course, reference_text  # noqa: E402

VERDICT = "PASSED ·"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", default="build-prefill")
    parser.add_argument("--saves", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        course = make_course(Path(tmp) / "course", reference_text())
        report = Path(tmp) / "run.json"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "theinference",
                "test",
                "--watch",
                "-C",
                str(course),
                "-s",
                args.stage,
                "--json",
                str(report),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
        try:
            cold = wait_for(lines, VERDICT, 600)
            print(f"first run (oracle cache as found): {cold:.2f} s after start")
            rows = [one_save(course, lines, report, i) for i in range(args.saves)]
        finally:
            proc.kill()
    total = [r[0] for r in rows]
    student = [r[1] for r in rows]
    grader = [t - s for t, s in rows]
    print(f"\nstage {args.stage}, {args.saves} saves, warm oracle cache")
    print(f"{'':<22}{'median':>9}{'min':>9}{'max':>9}")
    for name, xs in (
        ("save -> verdict", total),
        ("student's code", student),
        ("grader's share", grader),
    ):
        print(f"{name:<22}{statistics.median(xs):>8.3f}s{min(xs):>8.3f}s{max(xs):>8.3f}s")


def one_save(course: Path, lines: queue.Queue, report: Path, i: int) -> tuple[float, float]:
    kvcache = course / "src" / "kvcache.py"
    time.sleep(0.5)
    before = report.stat().st_mtime_ns
    saved = time.monotonic()
    kvcache.write_text(reference_text() + f"\n# edit {i}\n")
    elapsed = wait_for(lines, VERDICT, 600, since=saved)
    while report.stat().st_mtime_ns == before:  # written just after the verdict is printed
        time.sleep(0.01)
    student = json.loads(report.read_text())["timings"]["student_seconds"]
    return elapsed, student


def wait_for(lines: queue.Queue, text: str, timeout: float, since: float | None = None) -> float:
    start = since or time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            line = lines.get(timeout=0.05)
        except queue.Empty:
            continue
        if text in line:
            return time.monotonic() - start
    raise SystemExit(f"no verdict within {timeout} s")


if __name__ == "__main__":
    main()
