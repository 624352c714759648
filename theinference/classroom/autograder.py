"""The Gradescope autograder: `gradescope build` zips setup.sh, run_autograder, the course's
settings and this very theinference; `gradescope warm` (run by setup.sh when the image is
built) makes the weights and the oracle's answers for every public case, so no student waits
on a cold oracle, and for a TypeScript course installs the course's pinned runner (setup.sh
installs Node first); `gradescope run` (run by run_autograder) grades /autograder/submission,
in its own language.

The root is /autograder unless THEINFERENCE_AUTOGRADER_ROOT says otherwise (the tests lay out
a temporary root like Gradescope's).
"""

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from theinference import __version__
from theinference.atomic import atomic_write
from theinference.classroom.batch import Plan, run_test
from theinference.classroom.intake import (
    IntakeError,
    Submission,
    content_hash,
    course_language,
    read_files,
)
from theinference.course import languages
from theinference.course.directory import SETTINGS_FILE, TEMPLATE_DIR
from theinference.course.settings import Settings
from theinference.grading.provenance import seed_label
from theinference.oracle.weights import cache_dir
from theinference.results import RunResult

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SOURCE_DIR = "theinference-src"  # in the bundle: this theinference, installed by setup.sh

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image.
set -euo pipefail
cd "$(dirname "$0")"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y bubblewrap python3-venv python3-pip
apt-get install -y python3.11 python3.11-venv || true  # theinference needs Python >= 3.11
PY=python3; command -v python3.11 >/dev/null && PY=python3.11
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version'
"$PY" -m venv /autograder/venv
# theinference {version}, the very copy that built this bundle, with its dependencies
/autograder/venv/bin/pip install --upgrade pip
/autograder/venv/bin/pip install ./{source}
{node}# the weights and the oracle's answers for every public case, made now, not per submission
export THEINFERENCE_CACHE_DIR=/autograder/theinference-cache
/autograder/venv/bin/python -m theinference gradescope warm --settings ./{settings}
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade /autograder/submission, write
# /autograder/results/results.json.
set -uo pipefail
ROOT="${{THEINFERENCE_AUTOGRADER_ROOT:-/autograder}}"
PY="${{THEINFERENCE_AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}"
export THEINFERENCE_CACHE_DIR="$ROOT/theinference-cache"
cd "$ROOT"
exec "$PY" -m theinference gradescope run --root "$ROOT"
"""


def build_bundle(settings_toml: bytes | None, out: Path) -> list[str]:
    """The autograder zip, files at its root as Gradescope requires; returns the names."""
    toml = settings_toml or (TEMPLATE_DIR / SETTINGS_FILE).read_bytes()
    runtime = course_language(toml).setup_lines  # e.g. Node, for a TypeScript course
    entries: dict[str, tuple[bytes, int]] = {
        "setup.sh": (SETUP_SH.format(version=__version__, source=SOURCE_DIR, node=runtime,
                                     settings=SETTINGS_FILE).encode(), 0o755),
        "run_autograder": (RUN_AUTOGRADER.format().encode(), 0o755),
        SETTINGS_FILE: (toml, 0o644),
    }
    for path in source_files():
        entries[f"{SOURCE_DIR}/{path.relative_to(PACKAGE_DIR.parent).as_posix()}"] = (
            path.read_bytes(), 0o644)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, (data, mode) in sorted(entries.items()):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return sorted(entries)


def source_files() -> list[Path]:
    """The package as it runs here (bytecode left out) and a pyproject.toml to install it."""
    files = [p for p in PACKAGE_DIR.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    project = PACKAGE_DIR.parent / "pyproject.toml"
    return sorted(files) + ([project] if project.is_file() else [])


def warm(settings: Settings, points: dict[str, float]) -> tuple[int, float]:
    """The oracle's answer (and float32 noise) for every public case of the graded stages,
    into the answer cache, and a TypeScript course's runner; returns (answers, seconds)."""
    import time

    from theinference.curriculum.checks import CHECKS
    from theinference.curriculum.stages import load_stages
    from theinference.grading.answers import Answers
    from theinference.oracle.weights import load_weights

    started = time.monotonic()
    language = settings.language or languages.DEFAULT
    language.runner.shared(cache_dir())  # installed now, so each submission only copies it
    weights = load_weights(settings.weights, Path.cwd())
    answers = Answers.cached(weights)
    count = 0
    for stage in (s for s in load_stages() if s.slug in points):
        # a case drawn whole per run (no submission may know it) has nothing to warm; one whose
        # floor alone meets drawn inputs keeps its fixed ones (stages.for_floor)
        for case in (c for c in stage.cases if "draw" not in c.inputs):
            args = CHECKS[case.check].arguments(case, weights.config)
            answers.expected(case.check, args)
            answers.noise(case.check, args)  # None, at no cost, where the check has none
            count += 1
    return count, time.monotonic() - started


@dataclass(frozen=True)
class Graded:
    """What grading root/submission came to: the run `theinference test` graded, or why
    there is none; and what Gradescope's extra_data records."""

    results: RunResult | None
    failure: str = ""
    extra: dict | None = None


def grade_submission(root: Path, plan: Plan) -> Graded:
    """Grade root/submission (a rejected or unrunnable submission says why)."""
    try:
        files = read_files(Submission("submission", root / "submission"))
    except (IntakeError, OSError) as exc:
        return Graded(None, f"Your submission could not be taken: {exc}")
    status, message, results = run_test(files, plan, jobs=1)
    if results is None:
        return Graded(None, f"The grader could not finish ({status}): {message}")
    provenance = {**results.provenance, "seed": seed_label(plan.seed)}
    extra = {"content_sha256": content_hash(files), "seed": plan.seed.value,
             "provenance": provenance}
    return Graded(results, extra=extra)


def write_results(root: Path, data: dict) -> Path:
    path = root / "results" / "results.json"
    atomic_write(path, json.dumps(data, indent=2) + "\n")
    return path
