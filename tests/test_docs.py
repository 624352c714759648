"""The documentation's commands: every one the docs show is accepted as written, and README's run.

Each `theinference ...` line of a shell block in README.md or docs/*.md is parsed by the command
line itself (its subcommand, options and choices), so a renamed option or a stale example fails
here; README's own commands are run for real in a throwaway course, HOME and cache.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from theinference.cli import app

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)
STUDENT_README_LINES = 162  # "about 150": the student's page stays one screenful of sections


def shell_lines(path: Path) -> list[str]:
    """Every command of the shell blocks: lines split at `&&` and `;`, comments dropped."""
    lines = []
    for block in SHELL_BLOCK.findall(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            lines += [part.strip() for part in re.split(r"&&|;", line) if part.strip()]
    return lines


def documented(prefix: str) -> list[tuple[str, str]]:
    return [(path.name, line) for path in DOCS for line in shell_lines(path)
            if line.startswith(prefix)]


def parse(words: list[str]) -> None:
    """Parse a command line as the CLI would, through every subcommand, without running it.
    typer carries its own copy of click, so the classes are reached through the command."""
    command = typer.main.get_command(app)
    context = command.make_context("theinference", list(words))
    while hasattr(command, "resolve_command"):
        leading = getattr(context, "protected_args", None) or context._protected_args
        name, command, rest = command.resolve_command(context, [*leading, *context.args])
        context = command.make_context(name, rest, parent=context)


def test_the_docs_show_theinference_commands():
    """Catches the extraction finding nothing (a changed fence): every check would pass."""
    assert len(documented("theinference ")) >= 15


@pytest.mark.parametrize(("page", "line"), documented("theinference "))
def test_every_documented_command_is_accepted(page, line):
    """Catches an example in the docs using a command, option or value the CLI refuses."""
    try:
        parse(shlex.split(line)[1:])
    except Exception as error:  # typer's own click: its usage errors carry format_message
        if hasattr(error, "format_message"):
            pytest.fail(f"{page}: `{line}`: {error.format_message()}")
        if getattr(error, "exit_code", 1) != 0:
            raise


def test_a_wrong_option_is_refused_by_the_parse():
    """Catches the parse above accepting anything (it would make every example pass)."""
    for words in (["test", "--no-such-option"], ["gradebook", "diff", "a", "b", "--nope"],
                  ["workflow", "slurm", "--shards", "many"]):
        with pytest.raises(Exception, match="(?i)no such option|valid int"):
            parse(words)


def benchmarks() -> list[tuple[str, str]]:
    """Every benchmark command of the docs, from `python`, whatever runs it (`env -u ...`)."""
    return [(path.name, line[line.index("python benchmarks/"):]) for path in DOCS
            for line in shell_lines(path) if "python benchmarks/" in line]


@pytest.mark.parametrize(("page", "line"), benchmarks())
def test_every_documented_benchmark_exists_with_its_options(page, line):
    """Catches a benchmark the docs name that was renamed, or an option it no longer takes."""
    words = shlex.split(line)
    script = ROOT / words[1]
    assert script.is_file(), f"{page}: {words[1]} does not exist"
    source = script.read_text()
    for option in (word.split("=")[0] for word in words[2:] if word.startswith("--")):
        assert option in source, f"{page}: {words[1]} takes no {option}"


def test_readme_is_the_students_page():
    """Catches README growing back into every audience's manual."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= STUDENT_README_LINES, len(lines)
    first_blocks = SHELL_BLOCK.findall((ROOT / "README.md").read_text())[:2]
    assert "theinference init" in first_blocks[0] and "theinference test" in first_blocks[0]
    assert first_blocks[1].strip() == "bash .ci/run"


def test_ci_runs_the_suite_once_as_the_docs_say():
    """Catches .ci/run running pytest otherwise than docs/development.md and README.md say it
    does (a second run, the slow cases left out of its one run)."""
    ci = [re.sub(r"\s+#.*$", "", line).strip()
          for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith("python -m pytest")]
    assert len(ci) == 1, ci
    assert ci[0] in shell_lines(ROOT / "docs" / "development.md"), ci[0]
    assert f"`{ci[0].removeprefix('python -m ')}`" in " ".join(
        (ROOT / "README.md").read_text().split()), ci[0]
    # its one run leaves out neither half: test_docs_run.py holds slow tests and others
    whole = subprocess.run([sys.executable, *shlex.split(ci[0])[1:], "--collect-only", "-q",
                            "-n", "0", "-p", "no:cacheprovider", "tests/test_docs_run.py"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-2000:]
    assert "::test_the_instructors_page_runs" in whole.stdout, whole.stdout[-2000:]
    assert "::test_every_command_of_the_pages_is_run_or_checked" in whole.stdout
    assert "deselected" not in whole.stdout.splitlines()[-1], whole.stdout[-500:]


def test_the_suites_groups_keep_to_one_worker(tmp_path):
    """Catches `xdist_group` ignored by the installed pytest and pytest-xdist (pytest 9.2 keeps
    a test's id where pytest-xdist 3.8 adds the group): a module fixture the suite builds once
    per group (a graded class, a Slurm cluster on fixed ports) would then be built on both
    workers. Three tests of one group, run on two workers under the suite's own options."""
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\npytestmark = pytest.mark.xdist_group('one')\n"
        + "".join(f"def test_{i}():\n    print(os.environ['PYTEST_XDIST_WORKER'])\n"
                  for i in range(3)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", "-v", "-c", os.devnull, str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers = set(re.findall(r"\[(gw\d+)\] .*PASSED", done.stdout))
    assert len(workers) == 1, done.stdout[-2000:]


def test_every_doc_page_is_linked_from_the_readme():
    """Catches a page of docs/ that no reader can find from the front page."""
    readme = (ROOT / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"docs/{page.name}" in readme, page.name


def run(line: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    words = shlex.split(line)
    assert words[0] == "theinference", line
    return subprocess.run([sys.executable, "-m", "theinference", *words[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_readmes_student_commands_run(tmp_path, weights_cache):
    """Catches README's first commands failing on an untouched course: init, stages, hint, and
    test (every stage todo, exit 1, never a grader error)."""
    env = {**os.environ, "HOME": str(tmp_path / "home"),
           "THEINFERENCE_CACHE_DIR": str(weights_cache)}
    env.pop("THEINFERENCE_SEED", None)
    clone = tmp_path / "clone"  # README's first command runs in a clone of the repository
    clone.mkdir()
    course = None
    for line in [line for _, line in documented("theinference ") if _ == "README.md"]:
        if "--watch" in line:
            continue  # watch mode runs in a real terminal in tests/test_watch.py
        if line.startswith("theinference init"):
            course = (clone / shlex.split(line)[2]).resolve()
        assert line.startswith("theinference init") or course, f"`{line}` before any init"
        cwd = clone if line.startswith("theinference init") else course
        done = run(line.replace("DIR", "my-course"), cwd, env)
        expected = {0, 1} if line.startswith("theinference test") else {0}
        assert done.returncode in expected, f"`{line}`: {done.returncode}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stdout + done.stderr, line
        if line.startswith("theinference test"):
            assert "todo" in done.stdout, done.stdout[-2000:]
