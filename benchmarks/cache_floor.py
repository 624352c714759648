"""The floors on this machine: per cost proof (generate-loop's and prefix-caching's), a correct
solution's CPU time measured alone, the recompute floor and the limit (its stage's fraction),
and the margins.

    python benchmarks/cache_floor.py [--solutions reference_kvcache.py ...] [--seed N]

Each proof is called as the floor judges it where no swap proves anything: alone in a fresh
process, with no swap, measured from outside the student's process (grading/measured.py), on the
prompt the floor meets for the seed (stages.for_floor). A pass over the swap never needs this
margin; a cache the swap cannot find does.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import make_course  # noqa: E402
from theinference.curriculum.checks import CHECKS  # noqa: E402
from theinference.curriculum.stages import for_floor, load_stages, with_run_draws  # noqa: E402
from theinference.grading.answers import Answers  # noqa: E402
from theinference.grading.measured import measured_call  # noqa: E402
from theinference.oracle.weights import load_weights  # noqa: E402
from theinference.student.channel import NO_PROBE  # noqa: E402
from theinference.student.process import StudentProcess  # noqa: E402
from theinference.student.setup import Limits, ProcessSetup  # noqa: E402

SOLUTIONS = ROOT / "tests" / "solutions"


def cost_proofs(seed: int) -> list[tuple]:
    """(stage, case) of every cost proof, as a run with `seed` draws it, its floor's inputs."""
    proofs = []
    for stage in load_stages():
        for case in with_run_draws(stage, seed).cases:
            if CHECKS[case.check].flop is not None and ("drawn" in case.inputs
                                                        or "floor" in case.inputs):
                proofs.append((stage, for_floor(case)))
    return proofs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", nargs="*", default=["reference_kvcache.py"])
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    weights = load_weights("synthetic", Path("."))
    answers = Answers(weights)
    for name in options.solutions:
        course = make_course(Path(tempfile.mkdtemp()) / "course", (SOLUTIONS / name).read_text())
        process = StudentProcess(ProcessSetup(course, weights.path, Limits(timeout=1800)))
        print(name)
        try:
            for stage, case in cost_proofs(options.seed):
                check = CHECKS[case.check]
                args = check.arguments(case, weights.config)
                started = time.monotonic()
                outcome = measured_call(stage, check, args, process, answers, NO_PROBE)
                row = outcome.measured or {}
                cpu, floor, limit = (row.get(k) for k in ("cpu_seconds", "floor", "limit"))
                if not (cpu and floor):
                    print(f"  {stage.slug:16} not measured: {row} {outcome.message[:160]}")
                    continue
                print(f"  {stage.slug:16} cpu {cpu:6.2f} s  floor {floor:6.1f} s  stop at "
                      f"{limit:6.1f} s  floor/cpu {floor / cpu:4.1f}x  "
                      f"limit/cpu {limit / cpu:4.1f}x"
                      f"  rate {row['rate'] / 1e9:.1f} GFLOP/cpu-s  "
                      f"({time.monotonic() - started:.0f} s wall, {outcome.kind})")
        finally:
            process.close()


if __name__ == "__main__":
    main()
