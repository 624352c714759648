"""docs/instructors.md and docs/typescript.md, run as written: every command of their shell
blocks, taken from the page by tests/test_docs.py's extraction (so an edited page is what
runs), in the page's order, in a throwaway folder with its own HOME and the suite's weights
cache, each checked for what the page says it does: its exit code, the files it says it writes
and what they hold.

The instructors' page grades a class of two (the untouched template, as a folder, and the
reference solution, as a .zip) under the page's own course settings with their stage list cut
to the first stage: the page's six stages would cost minutes a submission, and the cut is
itself checked (every record holds that stage alone). What is not run, and why:

- `pip install ...` (here and in README.md and docs/development.md): the suite runs inside the
  install it would make.
- `kubectl ...` and its wait loop: no Kubernetes here. The generated YAML is checked to hold
  exactly one Job for each `-l` selector, and the Job the loop waits on is the one the first
  `kubectl apply` creates.
- `bash grade-class.slurm` runs as written, but against stand-in sbatch, squeue and scancel
  first on PATH (tests/test_cluster_scripts.py's): a cluster this machine may know would be
  asked for the page's `--account cs101 --partition cpu`, and a real queue is not a test's to
  fill. tests/test_slurm_real.py submits a class to a real one-node Slurm in the slow suite.
- `npm install`: the suite's pinned runner (THEINFERENCE_NODE_MODULES) is copied in instead of
  fetched, checked first to be the versions the course's package.json pins.
- README.md's `theinference` commands run in tests/test_docs.py; its `bash .ci/run` and
  development.md's `python -m pytest`, `ruff check .` are the suite and lint themselves, run
  by .ci/run; development.md's benchmarks (minutes each, some needing torch) are checked to
  exist with their options by tests/test_docs.py.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests import classroom_helpers as ch
from tests.doc_commands import CHECKS, GRADED, Page, command_name, ok, option, run_theinference
from tests.test_cluster_scripts import STAND_INS
from tests.test_docs import ROOT, shell_lines
from tests.test_typescript import NODE_MODULES

INSTRUCTORS = ROOT / "docs" / "instructors.md"
TYPESCRIPT = ROOT / "docs" / "typescript.md"


def submit_slurm(line, page):
    """Prints what the page's sample shows, with the ids sbatch gave; a second submission first
    cancels the last one's jobs, the merge before the array."""
    bin_dir = page.cwd.parent / "stand-ins"
    bin_dir.mkdir(exist_ok=True)
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**page.env, "PATH": f"{bin_dir}:{page.env['PATH']}"}
    done = subprocess.run(shlex.split(line), cwd=page.cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    ok(done, shlex.split(line))
    array = 101 + 2 * page.before  # the stand-in sbatch counts from 101
    sample = re.search(r"Submitting prints.*?```\n(.*?)```", INSTRUCTORS.read_text(), re.S)[1]
    ids = re.search(r"array job (\d+).*?job (\d+)", sample, re.S).groups()
    sample = sample.replace(ids[0], str(array)).replace(ids[1], str(array + 1))
    assert set(sample.splitlines()) <= set(done.stdout.splitlines()), (sample, done.stdout)
    assert (page.cwd / "logs" / "jobs").read_text() == f"{array} {array + 1}\n"
    cancelled = (bin_dir / "scancel.log").read_text() if page.before else ""
    assert cancelled == (f"{array - 1}\n{array - 2}\n" if page.before else "")


def kubectl_apply(line, page):
    """Not run: the file's one Job the label selects (`-l step=...`)."""
    words = shlex.split(line)
    key, value = option(words, "-l").split("=")
    docs = yaml.safe_load_all((page.cwd / option(words, "-f")).read_text())
    chosen = [d for d in docs if d["metadata"]["labels"].get(key) == value]
    assert [d["kind"] for d in chosen] == ["Job"], (line, chosen)
    assert chosen[0]["metadata"]["name"] not in page.applied
    page.applied.append(chosen[0]["metadata"]["name"])


def kubectl_wait(line, page):
    """Not run: the loop waits on the Job the first `kubectl apply` created."""
    assert page.applied and re.search(r"kubectl get job (\S+)", line)[1] == page.applied[-1]


def change_directory(line, page):
    page.cwd = page.cwd / shlex.split(line)[1]
    assert page.cwd.is_dir(), line


def npm_install(line, page):
    """The runner npm would install, copied from the suite's: the versions package.json pins."""
    pinned = json.loads((page.cwd / "package.json").read_text())["devDependencies"]
    for name, version in pinned.items():
        installed = json.loads((NODE_MODULES / name / "package.json").read_text())["version"]
        assert installed == version, (name, installed, version)
    shutil.copytree(NODE_MODULES, page.cwd / "node_modules", symlinks=True)  # the sandbox
    # binds the course alone: a link out of it would dangle


def not_run(line, page):
    """`pip install`, and the rest of the wait loop `kubectl_wait` checks."""


STEPS = {"theinference ": run_theinference, "bash grade-class.slurm": submit_slurm,
         "kubectl apply ": kubectl_apply, "until kubectl get job ": kubectl_wait,
         "cd ": change_directory, "npm install": npm_install, "pip install ": not_run,
         "grep -Eq ": not_run, "do sleep ": not_run, "done": not_run}


def step_for(line: str):
    return next((step for prefix, step in STEPS.items() if line.startswith(prefix)), None)


def run_page(path: Path, page: Page) -> None:
    for line in shell_lines(path):
        step = step_for(line)
        assert step is not None, f"{path.name}: nothing here runs `{line}`"
        page.before = page.seen[line]
        step(line, page)
        page.seen[line] += 1


def page_env(tmp_path: Path, cache: Path) -> dict:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "THEINFERENCE_CACHE_DIR": str(cache),
           "COLUMNS": "200"}
    env.pop("THEINFERENCE_SEED", None)
    return env


def test_every_command_of_the_pages_is_run_or_checked():
    """Catches a command added to either page that nothing here runs or checks (the slow run
    would refuse it too, but only in the slow suite), and the extraction finding nothing."""
    lines = [line for path in (INSTRUCTORS, TYPESCRIPT) for line in shell_lines(path)]
    assert len(lines) >= 25, lines
    assert not [line for line in lines if step_for(line) is None]
    theinference = [shlex.split(line) for line in lines if line.startswith("theinference ")]
    unchecked = {command_name(words) for words in theinference} - set(CHECKS)
    assert not unchecked, unchecked


def course_settings() -> str:
    """The page's course settings, their stage list cut to the first stage."""
    from theinference.course.settings import parse_settings

    (text,) = re.findall(r"```toml\n(.*?)```", INSTRUCTORS.read_text(), re.S)
    parse_settings(tomllib.loads(text))  # as the page writes them, they are valid
    cut, n = re.subn(r"stages = \[.*?\]", f"stages = {json.dumps(GRADED)}", text, flags=re.S)
    assert n == 1, text
    return cut


@pytest.mark.slow
def test_the_instructors_page_runs(tmp_path, weights_cache):
    """Catches a command of the instructors' page that fails as written, or that does not do
    what the page says: the course, the autograder zip and its settings, the records and their
    provenance, the gradebook, a rerun that regrades, the class report and student pages,
    an unchanged regrade that diffs non-empty, the workflow files and their options, the Slurm
    script's submission and resubmission, and YAML the page's kubectl lines would not select."""
    folder = tmp_path / "class"
    (folder / "submissions").mkdir(parents=True)
    ch.add(folder / "submissions", "ann", None, scratch=tmp_path / "scratch")
    ch.add(folder / "submissions", "bob", ch.reference(), "zip", scratch=tmp_path / "scratch")
    page = Page(folder, page_env(tmp_path, weights_cache), {"course/": course_settings()})
    run_page(INSTRUCTORS, page)
    assert page.applied == ["theinference-grade", "theinference-merge"]


@pytest.mark.slow  # 3-4 s alone, 9 s beside another test on two cores
def test_the_typescript_page_runs(tmp_path, weights_cache):
    """Catches the TypeScript page's one line failing: a course `init --lang ts` makes that
    `npm install` (its pinned runner) does not ready, or `theinference test` on it finding
    anything but every stage todo."""
    page = Page(tmp_path, page_env(tmp_path, weights_cache))
    run_page(TYPESCRIPT, page)
    assert (page.cwd / "node_modules" / "tsx").is_dir() and page.cwd.name == "my-course"
