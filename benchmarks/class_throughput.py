"""Class grading throughput: submissions per minute of `theinference grade` at --jobs 1 and 2.

Makes N submissions (the reference solution, each with a distinct comment so none is reused),
warms the oracle cache with one run, then grades all N at each --jobs into a fresh results
folder and prints wall time and submissions/minute. Figures on a shared machine are noisy.

    python benchmarks/class_throughput.py [N] [--stage SLUG ...]
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import make_course, reference_text  # noqa: E402


def grade(subs: Path, out: Path, jobs: int, stages: list[str]) -> float:
    options = [f"--stage={s}" for s in stages]
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "theinference", "grade", str(subs), "--out", str(out),
         "--jobs", str(jobs), *options],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return time.monotonic() - started


def main() -> None:
    args = sys.argv[1:]
    count = int(args[0]) if args and args[0].isdigit() else 6
    stages = [a.split("=", 1)[1] for a in args if a.startswith("--stage=")]
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "submissions"
        subs.mkdir()
        for i in range(count):
            make_course(subs / f"student{i:02d}", reference_text() + f"\n# student {i}\n")
        warm = Path(tmp) / "warm"
        (warm / "only").mkdir(parents=True)
        make_course(warm / "only" / "s", reference_text())
        grade(warm / "only", warm / "out", 1, stages)  # the oracle's answers, cached
        for jobs in (1, 2):
            seconds = grade(subs, Path(tmp) / f"out{jobs}", jobs, stages)
            print(f"--jobs {jobs}: {count} submissions in {seconds:.1f} s = "
                  f"{count / seconds * 60:.1f} submissions/minute")


if __name__ == "__main__":
    main()
