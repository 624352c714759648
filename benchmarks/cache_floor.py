"""The cache-use proofs on this machine: per cached stage, a correct solution's CPU time in the
proof case, the recompute floor and the budget (its stage's fraction), and the margins.

    python benchmarks/cache_floor.py [--solutions reference_kvcache.py ...] [--seed N]

Each solution is graded on the proof cases alone (grading.grader.grade, as `theinference test`
does); the figures come from the grader's own measure, from outside the student's process.
"""

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from theinference.curriculum.checks import CHECKS
from theinference.curriculum.stages import load_stages
from theinference.grading import judging
from theinference.grading.grader import grade
from theinference.oracle.weights import load_weights
from theinference.results.events import ignore
from theinference.student.setup import Limits

SOLUTIONS = Path(__file__).parents[1] / "tests" / "solutions"
PROOFS = ("reads the cache", "comes from the cache", "reuse is real")


def proof_stages(slugs: list[str]) -> list:
    stages = []
    for stage in load_stages():
        if slugs and stage.slug not in slugs:
            continue
        cases = tuple(c for c in stage.cases if any(p in c.name for p in PROOFS))
        if cases:
            stages.append(replace(stage, cases=cases, timeout=1800))
    return stages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--solutions", nargs="*", default=["reference_kvcache.py"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stages", nargs="*", default=[], help="default: every proof")
    options = parser.parse_args()
    from tests.helpers import make_course

    weights = load_weights("synthetic", Path("."))
    seen: list[dict] = []
    measured_call = judging.measured_call

    def recording(stage, check, args, process, answers):  # keep the figures the judge reads
        outcome = measured_call(stage, check, args, process, answers)
        seen.append({"stage": stage.slug, **(outcome.probe or {})})
        return outcome

    judging.measured_call = recording
    for name in options.solutions:
        course = make_course(Path(tempfile.mkdtemp()) / "course", (SOLUTIONS / name).read_text())
        started = time.monotonic()
        run = grade(
            course,
            proof_stages(options.stages),
            weights,
            Limits(timeout=1800),
            listener=ignore,
            seed=options.seed,
        )
        print(f"{name} ({time.monotonic() - started:.0f} s wall)")
        for stage in run.stages:
            for case in stage.cases:
                print(
                    f"  {stage.slug:22} {case.status.value:7} student {case.student_seconds:6.1f} s"
                    f"  {case.message[:160]}"
                )
        for row in seen:
            cpu, floor, limit = row.get("cpu_seconds"), row.get("floor"), row.get("limit")
            if cpu and floor:
                print(
                    f"  {row['stage']:22} cpu {cpu:.2f} s  floor {floor:.1f} s  stop at "
                    f"{limit:.1f} s  floor/cpu {floor / cpu:.1f}x  limit/cpu {limit / cpu:.1f}x"
                    f"  rate {row['rate'] / 1e9:.1f} GFLOP/cpu-s"
                )
        seen.clear()
    assert all(CHECKS)  # the checks are registered (imported above)


if __name__ == "__main__":
    main()
