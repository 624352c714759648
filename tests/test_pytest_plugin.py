"""`pytest` in a course directory (the plugin of theinference/commands/pytest_plugin.py) and
`npm test` in a TypeScript course: the same grader, the same verdicts, in the tools students
already run.

Each test runs pytest (or npm) in a subprocess inside a course directory made from the real
template in tmp_path, with HOME there too; the weights cache is the session's.
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.bugs import planted
from tests.helpers import STAGES, make_course, reference_text
from tests.test_typescript import ts_course
from theinference.curriculum.stages import load_stages
from theinference.grading.policy import EVERY_CASE, is_long, plan

ROOT = Path(__file__).parent.parent
PLUGIN = "theinference.commands.pytest_plugin"
SMALL = "one or two"  # -k: single-step-attention's three smallest cases (names with one/two)


def plugin_args() -> list[str]:
    """Loads the plugin by name where this environment was installed before its entry point
    existed (test_the_plugin_is_registered_as_a_pytest11_entry_point holds the declaration)."""
    names = {e.name for e in entry_points(group="pytest11")}
    return [] if "theinference" in names else ["-p", PLUGIN]


def env_for(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "THEINFERENCE_"))}
    bin_dir = str(Path(sys.executable).parent)  # `theinference` for npm's script
    return {
        **clean,
        "HOME": str(home),
        "THEINFERENCE_CACHE_DIR": os.environ["THEINFERENCE_CACHE_DIR"],
        "PATH": bin_dir + os.pathsep + clean.get("PATH", ""),
        "COLUMNS": "200",
    }


def pytest_in(course: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", *plugin_args(), *args]
    return subprocess.run(
        command, cwd=course, capture_output=True, text=True, env=env_for(course.parent)
    )


def cli_in(course: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "theinference", *args]
    return subprocess.run(
        command, cwd=course, capture_output=True, text=True, env=env_for(course.parent)
    )


def junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """`stage::case` -> (passed | failure | error | skipped, its text) from pytest's junit.xml."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        stage = case.get("classname").rsplit(".", 1)[-1]
        child = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        outcome = "passed" if child is None else child.tag
        text = "" if child is None else (child.text or "") + child.get("message", "")
        found[f"{stage}::{case.get('name')}"] = (outcome, text)
    return found


def expected_ids(seed_hidden: bool = False) -> list[str]:
    from theinference.curriculum.stages import with_hidden_cases

    ids = []
    for stage in load_stages():
        stage = with_hidden_cases(stage, 5) if seed_hidden else stage
        ids += [f"tests/adapters.py::{stage.slug}::{c.name}" for c in plan(stage, EVERY_CASE).cases]
    return ids


def test_the_plugin_is_registered_as_a_pytest11_entry_point():
    """Catches a plugin pytest never loads (no entry point) or one that costs every pytest run
    in the environment NumPy's import before it finds a course."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"theinference": PLUGIN}
    assert any(r.startswith("pytest") for r in project["optional-dependencies"]["pytest"])
    probe = f"import sys, {PLUGIN}; print(sorted(m for m in sys.modules if 'numpy' in m))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_collect_only_lists_each_stage_and_its_cases_beside_the_students_tests(tmp_path):
    """Catches a stage or case missing from an editor's test list, unstable node ids, hidden
    cases shown without a seed, or the student's own tests crowded out."""
    course = make_course(tmp_path / "course")
    (course / "tests" / "test_mine.py").write_text("def test_mine():\n    assert True\n")
    done = pytest_in(course, "--collect-only", "-q")
    listed = [line for line in done.stdout.splitlines() if "::" in line]
    assert done.returncode == 0, done.stdout + done.stderr
    assert listed == [*expected_ids(), "tests/test_mine.py::test_mine"]
    seeded = pytest_in(course, "--collect-only", "-q", "--theinference-seed", "5")
    hidden = [line for line in seeded.stdout.splitlines() if "::" in line and "hidden" in line]
    assert hidden and set(hidden) <= set(expected_ids(seed_hidden=True)), seeded.stdout
    assert set(expected_ids(seed_hidden=True)) - set(expected_ids()) == set(hidden)
    bad = pytest_in(course, "--collect-only", "-q", "--theinference-seed", "-1")
    assert bad.returncode != 0 and ">= 0" in bad.stdout + bad.stderr


def test_a_course_inside_another_project_is_not_graded_by_its_pytest(tmp_path):
    """Catches a project's own pytest (this repository's, with course fixtures in its tests/)
    grading every course folder it walks past: only pytest run in the course grades it."""
    project = tmp_path / "project"
    course = make_course(project / "tests" / "fixtures" / "course")
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (project / "tests" / "test_own.py").write_text("def test_own():\n    assert True\n")
    done = pytest_in(project, "--collect-only", "-q")
    listed = [line for line in done.stdout.splitlines() if "::" in line]
    assert done.returncode == 0 and listed == ["tests/test_own.py::test_own"], done.stdout
    inside = pytest_in(course, "--collect-only", "-q")
    assert any("::single-step-attention::" in line for line in inside.stdout.splitlines())


def test_the_plugin_is_inert_outside_a_course(tmp_path):
    """Catches the plugin grading (or collecting anything from) a project that merely has a
    tests/adapters.py, i.e. no theinference.toml beside it."""
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "adapters.py").write_text("raise SystemExit('imported')\n")
    (project / "tests" / "test_own.py").write_text("def test_own():\n    assert True\n")
    done = pytest_in(project, "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "adapters.py" not in done.stdout


def test_an_untouched_template_says_not_started_never_error(tmp_path):
    """Catches a todo stage shown as a grader error (or as passing): its first case fails
    saying "not started", the cases left after it are skipped saying the same."""
    course = make_course(tmp_path / "course")
    stages = ["single-step-attention", "full-decode-step"]
    junit = tmp_path / "junit.xml"
    done = pytest_in(course, *(f"tests/adapters.py::{s}" for s in stages), f"--junitxml={junit}")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = junit_outcomes(junit)
    for slug in stages:
        mine = {k: v for k, v in outcomes.items() if k.startswith(slug + "::")}
        first = plan(next(s for s in load_stages() if s.slug == slug), EVERY_CASE).cases[0]
        assert mine.pop(f"{slug}::{first.name}")[0] == "failure"
        assert mine and {o for o, _ in mine.values()} == {"skipped"}
    assert all("not started" in text for _, text in outcomes.values()), outcomes
    assert "Traceback" not in done.stdout and "INTERNALERROR" not in done.stdout


@pytest.mark.slow  # about 20 s: the default suite stays under 10 minutes
def test_a_planted_bug_fails_the_cases_the_cli_fails_with_its_diagnosis(tmp_path):
    """Catches pytest and `theinference test` disagreeing on a case, a failure text without
    the allclose report or the suspected bug the terminal names, -k not reaching the run, or
    --lf not finding the failed cases by their node ids."""
    course = make_course(tmp_path / "course", planted("attend-old-length"))
    stage = "single-step-attention"
    cli = cli_in(course, "test", "--stage", stage, "--case", "one", "--case", "two",
                 "--json", str(tmp_path / "r.json"))
    assert cli.returncode == 1, cli.stdout + cli.stderr
    (graded,) = json.loads((tmp_path / "r.json").read_text())["stages"]
    failed_by_cli = {f"{stage}::{c['name']}" for c in graded["cases"] if c["status"] == "failed"}
    assert len(failed_by_cli) >= 2 and graded["bug_name"]

    junit = tmp_path / "junit.xml"
    done = pytest_in(course, f"tests/adapters.py::{stage}", "-k", SMALL, f"--junitxml={junit}")
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = junit_outcomes(junit)
    assert {k for k, (o, _) in outcomes.items() if o == "failure"} == failed_by_cli
    assert {k for k, (o, _) in outcomes.items() if o == "passed"} == {
        f"{stage}::{c['name']}" for c in graded["cases"] if c["status"] == "passed"
    }
    for key in failed_by_cli:
        text = outcomes[key][1]
        assert f"suspected bug: {graded['bug_name']}" in text and "max abs diff" in text, text
    again = pytest_in(course, "--lf", "--collect-only", "-q")
    rerun = {line.split("::", 1)[1] for line in again.stdout.splitlines() if "::" in line}
    assert rerun == failed_by_cli, again.stdout


def test_a_failed_prerequisite_skips_the_stage_that_needs_it(tmp_path):
    """Catches a stage graded on top of a prerequisite that failed (the CLI skips it), also
    when pytest reaches the dependent stage's items first."""
    course = make_course(tmp_path / "course", planted("missing-ln-f"))
    later = "tests/adapters.py::full-decode-step::one-token prompt"
    earlier = "tests/adapters.py::build-prefill::one-token prompt"
    done = pytest_in(course, later, earlier, "-rs")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 skipped" in done.stdout
    assert "requires build-prefill, which failed" in done.stdout


def test_a_course_that_cannot_be_graded_fails_each_case_with_the_reason(tmp_path):
    """Catches a weights or settings problem shown as a grader traceback in pytest instead of
    the message `theinference test` gives."""
    course = make_course(tmp_path / "course")
    (course / "theinference.toml").write_text('weights = "missing.safetensors"\n')
    cli = cli_in(course, "test", "--stage", "single-step-attention")
    reason = cli.stderr.removeprefix("error: ").split("\n")[0][:60]
    assert cli.returncode == 4 and reason, cli.stderr
    done = pytest_in(course, "tests/adapters.py::single-step-attention", "-x")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout and f"theinference: {reason}" in done.stdout
    assert "Traceback" not in done.stdout and "INTERNALERROR" not in done.stdout


def npm_test(course: Path, *args: str) -> subprocess.CompletedProcess:
    npm = shutil.which("npm")
    assert npm, "npm is missing: the TypeScript course needs Node and npm (.ci/run installs them)"
    return subprocess.run(
        [npm, "test", "--", *args], cwd=course, capture_output=True, text=True,
        env=env_for(course.parent),
    )


def same_verdict_by_npm_and_cli(course: Path, *args: str) -> tuple[int, dict]:
    """`npm test -- ARGS` and `theinference test ARGS`: their common exit code and verdicts."""
    results = course.parent / "npm.json", course.parent / "cli.json"
    by_npm = npm_test(course, *args, "--json", str(results[0]))
    direct = cli_in(course, "test", *args, "--json", str(results[1]))
    assert by_npm.returncode == direct.returncode, by_npm.stdout + by_npm.stderr
    assert statuses(results[0]) == statuses(results[1])
    return direct.returncode, statuses(results[1])


@pytest.mark.slow  # about 20 s: the default suite stays under 10 minutes
def test_npm_test_gives_the_verdict_and_exit_code_of_theinference_test(tmp_path):
    """Catches a TypeScript template whose `npm test` does not run the grader, or loses its
    exit code (a todo stage: 1; weights that do not exist: 4)."""
    course = ts_course(tmp_path / "course")
    no_sandbox = ["--sandbox", "none"]  # node_modules is linked from outside the course
    code, verdict = same_verdict_by_npm_and_cli(
        course, "--stage", "single-step-attention", *no_sandbox
    )
    assert (code, verdict) == (1, {"single-step-attention": "todo"})
    (course / "theinference.toml").write_text('language = "ts"\nweights = "missing.safetensors"\n')
    assert npm_test(course).returncode == cli_in(course, "test").returncode == 4


def statuses(path: Path) -> dict[str, str]:
    return {s["slug"]: s["status"] for s in json.loads(path.read_text())["stages"]}


def long_ids() -> list[str]:
    """The cases a quick run leaves out (the whole context's): the same checks as the short
    ones, graded in full on the reference by tests/test_grading.py."""
    return [f"tests/adapters.py::{stage.slug}::{c.name}"
            for stage in load_stages() for c in stage.cases if is_long(c)]


@pytest.mark.slow
def test_the_reference_passes_every_case_of_every_stage(tmp_path):
    """Catches a case the plugin reports differently from the grader's pass, or a stage it
    leaves out: every case collected, every stage's cases run through pytest but the long
    ones (each stage's proofs among those run, at the size the stage draws them)."""
    course = make_course(tmp_path / "course", reference_text())
    junit = tmp_path / "junit.xml"  # every case's collection: the test of -k and the seed
    deselected = [arg for node in long_ids() for arg in ("--deselect", node)]
    done = pytest_in(course, f"--junitxml={junit}", *deselected)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    outcomes = junit_outcomes(junit)
    ran = set(expected_ids()) - set(long_ids())
    assert sorted(outcomes) == sorted(i.split("::", 1)[1] for i in ran)
    assert {o for o, _ in outcomes.values()} == {"passed"}
    assert {k.split("::")[0] for k in outcomes} == set(STAGES)


@pytest.mark.slow
def test_npm_test_passes_the_typescript_reference_as_theinference_test_does(tmp_path):
    """Catches `npm test` and the grader disagreeing on a passing stage, in the sandbox a
    student's machine gives (50 s on 2 busy cores)."""
    reference = (ROOT / "tests" / "solutions_ts" / "reference_kvcache.ts").read_text()
    course = ts_course(tmp_path / "course", reference, copy=True)
    code, verdict = same_verdict_by_npm_and_cli(course, "--stage", "single-step-attention")
    assert (code, verdict) == (0, {"single-step-attention": "passed"})


def test_a_failure_text_shows_the_students_output_inert():
    """Catches an escape sequence in the student's output reaching pytest's terminal (it
    could erase the failure and draw a pass), or a todo case given a report instead of
    "not started"."""
    from theinference.output.plain import case_text
    from theinference.results import CaseResult, StageResult, Status

    hostile = "\x1b[2K\x1b[1A PASSED"
    case = CaseResult(name="c", status=Status.ERROR, message="boom", stdout=hostile)
    stage = StageResult("s", "S", Status.ERROR, [case], bug_name="a known bug", hint="do x")
    text = case_text(stage, "c")
    assert "\x1b" not in text and "\\x1b[2K" in text
    assert text.splitlines()[:2] == ["suspected bug: a known bug", "boom"]
    todo = CaseResult(name="t", status=Status.TODO, message="s: implement f in src/kvcache.py")
    assert case_text(StageResult("s", "S", Status.TODO, [todo]), "t").startswith("not started")


def definition_line(adapters: Path, name: str) -> int:
    """The 0-based line defining `name` in an adapters file, found by hand."""
    lines = adapters.read_text().splitlines()
    return next(i for i, line in enumerate(lines) if f" {name}(" in line)


def test_each_case_points_at_its_adapter_for_the_editor(tmp_path):
    """Catches every item located at line 0 of the adapters file, where an editor's "go to
    test" lands at the top instead of at the adapter the case calls (in either language)."""
    from theinference.curriculum.checks import CHECKS

    course = make_course(tmp_path / "course")
    junit = tmp_path / "junit.xml"
    done = pytest_in(course, "tests/adapters.py::build-prefill", f"--junitxml={junit}",
                     "-o", "junit_family=xunit1")  # xunit1 records each item's line
    assert done.returncode == 1, done.stdout + done.stderr
    adapters = course / "tests" / "adapters.py"
    lines = {case.get("name"): int(case.get("line")) for case in ET.parse(junit).iter("testcase")}
    (stage,) = [s for s in load_stages() if s.slug == "build-prefill"]
    for case in plan(stage, EVERY_CASE).cases:
        assert lines[case.name] == definition_line(adapters, CHECKS[case.check].adapter)
    assert {CHECKS[c.check].adapter for c in stage.cases} == {"run_prefill", "run_prefill_cache"}
    from theinference.commands.pytest_plugin import adapter_line
    from theinference.course import languages
    from theinference.course.directory import init_course

    typescript = tmp_path / "ts"
    init_course(typescript, languages.TYPESCRIPT)
    ts_adapters = typescript / "tests" / "adapters.ts"
    assert adapter_line(ts_adapters, "decode_step") == definition_line(ts_adapters, "runDecodeStep")


@pytest.mark.slow  # about 20 s: the default suite stays under 10 minutes
def test_a_failing_stage_names_its_bug_in_the_summary_and_says_its_diagnosis_once(tmp_path):
    """Catches pytest's short summary cut to "logits: 49892/..." where the suspected bug
    belongs, the stage's hint repeated in each of its failures, or junit.xml giving the whole
    stage's grading time to its first case and 0 to the others."""
    course = make_course(tmp_path / "course", planted("attend-old-length"))
    junit = tmp_path / "junit.xml"
    stage = "single-step-attention"
    done = pytest_in(course, f"tests/adapters.py::{stage}", "-k", SMALL, "-rf",
                     f"--junitxml={junit}")
    assert done.returncode == 1, done.stdout + done.stderr
    summary = [line for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(summary) >= 2, done.stdout
    assert all(" - suspected bug: " in line for line in summary), summary
    # among the failures (pytest's short summary may repeat a failure's text after them)
    failures = done.stdout.split("short test summary info")[0]
    assert failures.count("hint: ") == 1, done.stdout
    # each case its own time (a stage's whole time on its first case leaves the others 0),
    # never more between them than the session took
    root = ET.parse(junit).getroot()
    times = [float(case.get("time")) for case in root.iter("testcase")]
    suite = float(next(root.iter("testsuite")).get("time"))
    assert len(times) >= 2 and min(times) > 0 and sum(times) <= suite, (times, suite)


def test_npm_test_without_the_grader_on_path_says_how_to_fix_it(tmp_path):
    """Catches `npm test` in a new shell, outside the virtual environment, printing only
    `sh: 1: theinference: not found`: it says to activate the environment or install it."""
    from theinference.course import languages
    from theinference.course.directory import init_course

    course = tmp_path / "course"
    init_course(course, languages.TYPESCRIPT)
    npm = shutil.which("npm")
    assert npm, "npm is missing: the TypeScript course needs Node and npm (.ci/run installs them)"
    bare = os.pathsep.join({str(Path(p).parent) for p in (npm, shutil.which("node"))} | {"/bin"})
    assert shutil.which("theinference", path=bare) is None
    done = subprocess.run([npm, "test"], cwd=course, capture_output=True, text=True,
                          env={**env_for(tmp_path), "PATH": bare})
    assert done.returncode == 127, done.stdout + done.stderr
    assert "activate the virtual environment" in done.stderr
    assert "pip install theinference" in done.stderr


def test_a_stages_case_times_never_sum_past_the_stage():
    """Catches junit.xml's per-case times summing past the session's (seen in CI): a case's
    time is its student call's and the oracle's, which overlap (the oracle works while the
    student's code runs); scaled to the stage's own time where they would pass it, and left
    as they are where they do not."""
    from theinference.commands.pytest_plugin import own_seconds
    from theinference.results import CaseResult, StageResult, Status

    cases = [CaseResult(Status.PASSED, name=str(i), student_seconds=s, oracle_seconds=o)
             for i, (s, o) in enumerate([(1.0, 0.5), (2.0, 0.5)])]
    overlapped = StageResult("s", "S", Status.PASSED, cases=cases, seconds=3.0)
    assert sum(own_seconds(overlapped, c) for c in cases) == pytest.approx(3.0)
    assert own_seconds(overlapped, cases[1]) == pytest.approx(2.5 * 3.0 / 4.0)
    apart = StageResult("s", "S", Status.PASSED, cases=cases, seconds=5.0)
    assert [own_seconds(apart, c) for c in cases] == [1.5, 2.5]
