"""How much of `theinference test` is the grader rather than the student's code.

Grades a course holding the reference solution twice with a fresh cache directory (the first
run computes the oracle's answers, the second finds them) and prints each run's wall time split
from its JSON timings. Making the synthetic weights (about 4 s) happens before the first run's
timings start.

    python benchmarks/overhead.py
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import make_course, reference_text  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        course = make_course(Path(tmp) / "course", reference_text())
        report = Path(tmp) / "run.json"
        for label in ("cold", "warm"):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "theinference",
                    "test",
                    "-C",
                    str(course),
                    "--format",
                    "json",
                    "--output",
                    str(report),
                ],
                check=True,
                env={**os.environ, "THEINFERENCE_CACHE_DIR": str(Path(tmp) / "cache")},
            )
            t = json.loads(report.read_text())["timings"]
            outside = t["total_seconds"] - t["student_seconds"]
            print(
                f"{label} oracle cache: total {t['total_seconds']:.2f} s, student's code "
                f"{t['student_seconds']:.2f} s, oracle {t['oracle_seconds']:.2f} s, grader "
                f"{t['grader_seconds']:.2f} s (start-up {t['worker_startup_seconds']:.2f} s): "
                f"{100 * outside / t['total_seconds']:.1f}% outside the student's code"
            )


if __name__ == "__main__":
    main()
