"""The TypeScript reference solution's full run against the Python reference's, side by side.

Grades a course holding tests/solutions/reference_kvcache.py and one holding
tests/solutions_ts/reference_kvcache.ts with `theinference test`, one stage per command (default
timeouts, one seed, one shared cache: a first Python run fills the oracle's answers), the two
languages in turn stage by stage so both see the same machine, and prints per stage the wall
seconds and the student's code's share of them (the calls' own time, without the oracle's or the
grader's), then totals and ratios.

    python benchmarks/ts_vs_python.py

Needs Node and the runner in tests/fixtures/ts_runner (`npm ci --prefix tests/fixtures/ts_runner`).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import STAGES, make_course, reference_text  # noqa: E402
from theinference.course.directory import init_course  # noqa: E402
from theinference.course.languages import TYPESCRIPT  # noqa: E402

SEED = "7"
NODE_MODULES = Path(
    os.environ.get("THEINFERENCE_NODE_MODULES") or ROOT / "tests/fixtures/ts_runner/node_modules"
)


def courses(tmp: Path) -> dict[str, Path]:
    python = make_course(tmp / "python", reference_text())
    ts = tmp / "ts"
    init_course(ts, TYPESCRIPT)
    # a copy: a sandbox binds the course folder alone, where a link out of it would dangle
    shutil.copytree(NODE_MODULES, ts / "node_modules", symlinks=True)
    reference = ROOT / "tests/solutions_ts/reference_kvcache.ts"
    (ts / "src" / "kvcache.ts").write_text(reference.read_text())
    return {"Python": python, "TypeScript": ts}


def run(course: Path, cache: Path, out: Path, stage: str | None = None) -> dict:
    # one seed for both languages: the cases drawn per run (the cache-use proofs' prompt
    # lengths) and the hidden ones are then the same work in both
    command = [sys.executable, "-m", "theinference", "test", "-C", str(course), "--seed", SEED,
               "--format", "json", "--output", str(out), *(["--stage", stage] if stage else [])]
    env = {**os.environ, "THEINFERENCE_CACHE_DIR": str(cache)}
    subprocess.run(command, env=env, check=False, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    table: dict[str, dict[str, tuple]] = {"Python": {}, "TypeScript": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        made = courses(tmp)
        run(made["Python"], tmp / "cache", tmp / "warm.json")  # the oracle's answers, once
        for slug in STAGES:
            for language, course in made.items():
                (stage,) = run(course, tmp / "cache", tmp / "out.json", slug)["stages"]
                code = sum(c["student_seconds"] for c in stage["cases"])
                table[language][slug] = (stage["seconds"], code, stage["status"])
                print(language, slug, table[language][slug], flush=True)
                for case in stage["cases"]:
                    if case["status"] != "passed":  # a figure for a failing run means little
                        print("   ", case["name"], case["status"], case["message"][:300])
    print_table(table)


def print_table(table: dict[str, dict[str, tuple]]) -> None:
    print("per stage: wall s (the student's code s), status; ratios TypeScript / Python")
    print(f"{'stage':<24}{'Python':>26}{'TypeScript':>26}{'wall':>7}{'code':>7}")
    rows = list(table["Python"])
    for slug in rows:
        p, t = table["Python"][slug], table["TypeScript"][slug]
        print(f"{slug:<24}{cell(p):>26}{cell(t):>26}{ratio(t[0], p[0]):>7}{ratio(t[1], p[1]):>7}")
    p = [sum(table["Python"][s][i] for s in rows) for i in range(2)]
    t = [sum(table["TypeScript"][s][i] for s in rows) for i in range(2)]
    print(f"{'total':<24}{cell((*p, '')):>26}{cell((*t, '')):>26}{ratio(t[0], p[0]):>7}"
          f"{ratio(t[1], p[1]):>7}")


def cell(figures: tuple) -> str:
    wall, code, status = figures
    return f"{wall:.1f} ({code:.1f}) {status}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


if __name__ == "__main__":
    main()
