"""docs/course-authors.md, held: a toy stage, two toy bugs and a toy language (tests/toy_course.py)
added to a copy of the repository touch exactly the files the page lists for each, as many as
it says; and the toy is real: the grader lists the stage, passes a right answer and fails wrong
ones naming their bugs, `verify` grades it in every language, the solutions graded on every
stage pass it, and the toy language is listed, chosen by a course's settings and graded."""

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import toy_course as toy
from tests.helpers import installed, top_level_names, with_template_stubs
from tests.test_cache_layouts import LAYOUTS, OWN_ADAPTERS
from tests.test_typescript import NODE_MODULES

PAGE = toy.ROOT / "docs" / "course-authors.md"
WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen twenty")
NUMBERS = {word: number for number, word in enumerate(WORDS.split(" "))}
# an item of the page's lists: its number, then its files (`a` or `b`: either one), a colon
ITEM = re.compile(r"^\d+\. ((?:`[^`]+`(?: or )?)+):", re.M)
PLACEHOLDERS = {"<slug>": toy.SLUG, "<slug_with_underscores>": toy.SLUG.replace("-", "_"),
                "<name>": toy.LANGUAGE, "<worker>": toy.WORKER}


@dataclass(frozen=True)
class Section:
    """A section of the page: the counts its first sentence states, and its list's items, each
    the files (alternatives) one item names, the placeholders filled in for the toy."""

    counts: list[int]
    items: list[set[str]]


def section(title: str, counted: str) -> Section:
    text = PAGE.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    said = re.search(counted, " ".join(text.split()))
    assert said, f"docs/course-authors.md's {title!r} no longer says {counted!r}"
    items = [{filled(path) for path in re.findall(r"`([^`]+)`", m)} for m in ITEM.findall(text)]
    return Section([NUMBERS[word] for word in said.groups()], items)


def filled(path: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        path = path.replace(placeholder, value)
    return path


def unlisted(items: list[set[str]], places: set[str]) -> list:
    """What the items and the places touched disagree on: a place no item names, an item of
    which no place (or more than one) was touched. Empty when they agree."""
    named = set().union(*items)
    wrong = [f"touched, not listed: {p}" for p in sorted(places - named)]
    return wrong + [f"listed, not touched once: {sorted(i)}" for i in items
                    if len(i & places) != 1]


def miscounted(count: int, page: Section, places: set[str], step: str = "stage") -> str:
    return (f"the page says {count} and lists {len(page.items)}; the toy {step} touched "
            f"{len(places)}: {sorted(places)}")


@dataclass(frozen=True)
class Toy:
    root: Path
    places: dict[str, set[str]]  # what each addition touched


@pytest.fixture(scope="module")
def added(tmp_path_factory) -> Toy:
    """The copy, the toy added to it in steps, each step's places found."""
    root = toy.copy_repository(tmp_path_factory.mktemp("repository"))
    places = {}
    steps = {"stage": toy.add_stage, "error bug": toy.add_error_bug, "named bug": toy.add_bug,
             "language": toy.add_language, "runtime": toy.add_runtime}
    for step, add in steps.items():
        before = toy.snapshot(root)
        add(root)
        places[step] = toy.touched(before, toy.snapshot(root))
    places["language and runtime"] = places["language"] | places["runtime"]
    return Toy(root, places)


def test_a_stage_touches_the_files_the_page_lists_and_no_other(added):
    """Would catch the page saying a stage lives in fewer files than it does (a place added
    to the course, or one a review finds), naming a file a stage no longer touches, or
    miscounting the layouts a swapped stage adds."""
    page = section("Adding a stage", r"lives in (\w+) files.*?touches the other (\w+) too")
    (count, others), places = page.counts, added.places["stage"]
    assert count == len(page.items) == len(places), miscounted(count, page, places)
    assert not unlisted(page.items, places), unlisted(page.items, places)
    left = sorted(set(LAYOUTS) - {Path(p).name for p in places})
    assert others == len(left), f"the page says the other {others} layouts: {left}"


def test_a_bug_touches_the_files_the_page_lists(added):
    """Would catch a bug's place missing from the page, or either count wrong: a bug its error
    names, and one the grader names as the suspect (here, by the stage's judge)."""
    page = section("Adding a bug", r"lives in (\w+) files, and in (\w+) when")
    alone, named = page.counts
    assert named == len(page.items)
    for step, count in (("error bug", alone), ("named bug", named)):
        places = added.places[step]
        assert len(places) == count, miscounted(count, page, places, step)
        assert not unlisted(page.items[:count], places), (step, unlisted(page.items, places))


def test_a_language_touches_the_places_the_page_lists(added):
    """Would catch a language's knowledge needed somewhere the page does not name (a list of
    languages in a command's help, a test's table), or either count wrong."""
    page = section("Adding a language", r"lives in (\w+) places, and in (\w+) with a runtime")
    alone, with_runtime = page.counts
    assert with_runtime == len(page.items)
    for step, count in (("language", alone), ("language and runtime", with_runtime)):
        places = added.places[step]
        assert len(places) == count, miscounted(count, page, places, step)
        assert not unlisted(page.items[:count], places), (step, unlisted(page.items, places))


# --- the toy is real ---------------------------------------------------------------------------


@pytest.fixture
def env(added, weights_cache, tmp_path) -> dict:
    """The copy's package first on the path, in a throwaway HOME, the session's weights."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "THEINFERENCE_SEED")}
    return env | {"PYTHONPATH": str(added.root), "HOME": str(home), "COLUMNS": "200",
                  "THEINFERENCE_CACHE_DIR": str(weights_cache),
                  "THEINFERENCE_TEST_CACHE": str(weights_cache),
                  "THEINFERENCE_NODE_MODULES": str(NODE_MODULES)}


def run(env: dict, cwd: Path, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *words], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def cli(env: dict, cwd: Path, *words: str) -> subprocess.CompletedProcess:
    return run(env, cwd, "-m", "theinference", *words)


def graded(env: dict, course: Path) -> dict:
    """The toy stage graded in a course, with a hidden case: its result as --json writes it."""
    done = cli(env, course, "test", "-s", toy.SLUG, "--seed", "7", "--json", "results.json")
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    (stage,) = json.loads((course / "results.json").read_text())["stages"]
    return stage


def test_the_repositorys_own_checks_hold_with_the_toy_added(added, env):
    """Would catch a place the repository's own checks need that the page does not list (a
    stage whole, its words, its table rows, the TypeScript spelling of its adapter, no
    language named outside its places): they run in the copy and must pass."""
    checks = ["tests/test_curriculum.py", "tests/test_stages.py", "tests/test_language_object.py",
              "tests/test_protocol.py",
              "tests/test_cache_use.py::test_every_cached_stage_has_a_proof_no_recompute_can_give",
              "tests/test_typescript.py::test_every_bugs_words_in_typescript_quote_no_python"]
    done = run(env, added.root, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", *checks)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_toy_stage_is_listed_passes_a_right_answer_and_names_wrong_ones(added, env, tmp_path):
    """Would catch a stage the registry does not list, or that the grader cannot grade end to
    end from the places the page lists: the reference passes; the position ignored fails, its
    bug named by the judge; a float position errs, its bug named by the error."""
    assert re.search(rf"^\s*{toy.SLUG}\s", cli(env, tmp_path, "stages").stdout, re.M)
    course = tmp_path / "course"
    assert cli(env, tmp_path, "init", str(course)).returncode == 0
    reference = (added.root / toy.SOLUTIONS / "reference_kvcache.py").read_text()
    (course / "src" / "kvcache.py").write_text(reference)
    assert graded(env, course)["status"] == "passed"
    (course / "src" / "kvcache.py").write_text(reference.replace("row = position", "row = 0"))
    wrong = graded(env, course)
    assert (wrong["status"], wrong["suspected_bug"]) == ("failed", toy.BUG), wrong
    (course / "src" / "kvcache.py").write_text(reference.replace("= position", "= position / 1"))
    lessons = {case.get("lesson") for case in graded(env, course)["cases"]}
    assert lessons == {toy.FLOAT_POSITION}, lessons


@pytest.mark.parametrize("solutions", ["solutions", "solutions_ts", f"solutions_{toy.LANGUAGE}"])
def test_verify_grades_the_toy_stage_in_every_language(added, env, solutions, tmp_path):
    """Would catch a reference that fails the toy stage, or a planted bug that passes it or is
    named wrong, in any language's solutions folder (the toy language's among them)."""
    folder = added.root / "tests" / solutions
    done = cli(env, tmp_path, "verify", "--quick", "--solutions", str(folder), "-s", toy.SLUG)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2/2 as expected" in done.stdout, done.stdout[-2000:]


EVERY_STAGE = ["independent_kvcache.py", "paged_kvcache.py",
               pytest.param("transformers_kvcache.py", marks=pytest.mark.skipif(
                   not installed("transformers"), reason="transformers is not installed"))]


@pytest.mark.parametrize("layout", EVERY_STAGE)
def test_the_solutions_graded_on_every_stage_pass_the_toy_stage(added, env, layout, tmp_path):
    """Would catch the page listing a solution graded on every stage whose toy code is wrong
    (or missing), and with it a stage that cannot be added there."""
    course = tmp_path / "course"
    assert cli(env, tmp_path, "init", str(course)).returncode == 0
    (course / "src" / "kvcache.py").write_text((added.root / toy.SOLUTIONS / layout).read_text())
    if layout in OWN_ADAPTERS:
        adapters = (added.root / toy.SOLUTIONS / OWN_ADAPTERS[layout]).read_text()
        (course / "tests" / "adapters.py").write_text(adapters)
    assert graded(env, course)["status"] == "passed"


def test_the_other_layouts_need_nothing_for_a_stage_they_leave_out(added):
    """Would catch a layout the page leaves out that the toy stage breaks: with the template's
    stubs (tests/helpers.py), each defines every name the template's adapters import."""
    template = added.root / toy.PY_TEMPLATE
    adapters = ast.parse((template / "tests" / "adapters.py").read_text())
    imported = {alias.name for node in adapters.body if isinstance(node, ast.ImportFrom)
                and node.module == "src.kvcache" for alias in node.names}
    assert "embed_at" in imported
    for layout in set(LAYOUTS) - set(OWN_ADAPTERS) - {Path(p).name for p in added.places["stage"]}:
        text = (added.root / toy.SOLUTIONS / layout).read_text()
        assert "embed_at" not in top_level_names(ast.parse(text)), layout
        stubbed = top_level_names(ast.parse(with_template_stubs(text, template)))
        assert imported <= stubbed, (layout, imported - stubbed)


def test_the_toy_language_is_listed_chosen_by_the_settings_and_graded(added, env, tmp_path):
    """Would catch a language that `init` does not offer, that a course's theinference.toml
    does not choose, or that grades nothing: the toy course passes through the toy worker and
    spelling (toy_run_embed_at), and the same course said to be Python is refused."""
    assert re.search(rf"\| {toy.LANGUAGE}\b", cli(env, tmp_path, "init", "--help").stdout)
    course = tmp_path / "course"
    assert cli(env, tmp_path, "init", str(course), "--lang", toy.LANGUAGE).returncode == 0
    opened = "from theinference.course.directory import open_course; " \
             "print(open_course(__import__('pathlib').Path('.')).language.name)"
    assert run(env, course, "-c", opened).stdout.strip() == toy.LANGUAGE
    reference = added.root / f"tests/solutions_{toy.LANGUAGE}/reference_toy_kvcache.py"
    (course / "src" / "toy_kvcache.py").write_text(reference.read_text())
    assert graded(env, course)["status"] == "passed"
    settings = course / "theinference.toml"
    settings.write_text(settings.read_text().replace(f'"{toy.LANGUAGE}"', '"python"'))
    refused = cli(env, course, "test", "-s", toy.SLUG)
    assert refused.returncode not in (0, 1) and "tests/adapters.py" in refused.stderr, refused
