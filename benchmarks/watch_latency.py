"""Save -> first verdict line of `theinference test --watch`, for a failing and a passing stage.

Starts the watcher on a course holding the reference solution (stdout a pipe, so the log form),
then alternates saves of src/kvcache.py between the reference with a classic bug planted (its
first case fails) and the reference itself, timing each save until the first line that names the
stage's verdict (`<stage> ... FAILED` or `... PASSED`). The oracle's answers are warm after the
first run, as they are while a student works.

    python benchmarks/watch_latency.py [--stage single-step-attention] [--bug attend-old-length]
                                       [--saves 4]
"""

import argparse
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.bugs import planted  # noqa: E402
from tests.helpers import make_course, reference_text  # noqa: E402


def verdict_pattern(stage: str) -> re.Pattern:
    return re.compile(rf"{re.escape(stage)}\b.*\b(PASSED|FAILED|ERROR|TIMEOUT)\b")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", default="single-step-attention")
    parser.add_argument("--bug", default="attend-old-length")
    parser.add_argument("--saves", type=int, default=4, help="saves of each kind")
    args = parser.parse_args()
    pattern = verdict_pattern(args.stage)
    texts = {"failing": planted(args.bug), "passing": reference_text()}
    with tempfile.TemporaryDirectory() as tmp:
        course = make_course(Path(tmp) / "course", reference_text())
        proc = start_watcher(course, args.stage)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
        try:
            cold, _ = wait_for(lines, pattern, 900)
            print(f"first run (oracle cache as found): {cold:.2f} s after start")
            times = {kind: [] for kind in texts}
            for i in range(args.saves):
                for kind, text in texts.items():
                    times[kind].append(one_save(course, lines, pattern, text + f"\n# {i}\n"))
        finally:
            proc.kill()
    print(f"\nstage {args.stage}, failing = bug {args.bug}; save -> first verdict line")
    print(f"{'':<10}{'median':>9}{'min':>9}{'max':>9}")
    for kind, xs in times.items():
        print(f"{kind:<10}{statistics.median(xs):>8.2f}s{min(xs):>8.2f}s{max(xs):>8.2f}s")


def start_watcher(course: Path, stage: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "theinference", "test", "--watch", "-C", str(course), "-s", stage],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def one_save(course: Path, lines: queue.Queue, pattern: re.Pattern, text: str) -> float:
    time.sleep(1.0)  # let the previous run settle, as a student between saves
    drain(lines)
    saved = time.monotonic()
    (course / "src" / "kvcache.py").write_text(text)
    elapsed, line = wait_for(lines, pattern, 900, since=saved)
    wait_for(lines, re.compile("watching for changes"), 900)  # the run is over
    return elapsed


def drain(lines: queue.Queue) -> None:
    while not lines.empty():
        lines.get_nowait()


def wait_for(lines: queue.Queue, pattern: re.Pattern, timeout: float, since: float | None = None):
    start = since or time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            line = lines.get(timeout=0.02)
        except queue.Empty:
            continue
        if pattern.search(line):
            return time.monotonic() - start, line
    raise SystemExit(f"no line matching {pattern.pattern!r} within {timeout} s")


if __name__ == "__main__":
    main()
