"""The student's language is one object, chosen once: what differs between languages lives in
theinference/course/languages/, and no other module tells languages apart by their names."""

import ast
from pathlib import Path

import pytest

import theinference
from theinference.course import languages
from theinference.course.directory import init_course, open_course
from theinference.course.languages import PYTHON, TYPESCRIPT
from theinference.student.placement import Placement
from theinference.student.sandbox import Sandbox

PACKAGE = Path(theinference.__file__).parent
LANGUAGE_PACKAGE = PACKAGE / "course" / "languages"
TEMPLATES = PACKAGE / "course" / "templates"
# a language's name as settings say it and as a word ("typescript"), and the constants naming
# one (the default aside: comparing with it is a rule, not a language's name)
NAMES = {name for language in languages.ALL for name in (language.name, language.title.lower())}
CONSTANTS = {name for name, value in vars(languages).items()
             if isinstance(value, languages.Language) and name != "DEFAULT"}


def names_a_language(node: ast.AST) -> bool:
    """A language's name as a literal ("ts"), its constant (TYPESCRIPT, languages.PYTHON), or
    a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Name):
        return node.id in CONSTANTS
    if isinstance(node, ast.Attribute):
        return node.attr in CONSTANTS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(names_a_language(item) for item in node.elts)
    return False


def language_by_name(source: str) -> list[int]:
    """Lines that compare with a language's name, or hold a table keyed by languages' names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            sides = [key for key in node.keys if key is not None and names_a_language(key)][1:]
        else:
            continue
        if any(names_a_language(side) for side in sides):
            found.append(node.lineno)
    return found


def outside_the_language_modules() -> list[Path]:
    skipped = (LANGUAGE_PACKAGE, TEMPLATES)
    return [p for p in PACKAGE.rglob("*.py") if not any(s in p.parents for s in skipped)]


def test_no_module_tells_languages_apart_by_name():
    """Catches an `if language == TYPESCRIPT:` branch or a {"python": ..., "ts": ...} table
    added outside course/languages/: a third language would then have to find and edit it."""
    found = {
        p.relative_to(PACKAGE).as_posix(): lines
        for p in outside_the_language_modules()
        if (lines := language_by_name(p.read_text()))
    }
    assert not found, found


@pytest.mark.parametrize("planted", [
    'if language == "ts":\n    pass\n',
    "if lang != TYPESCRIPT:\n    pass\n",
    "ok = settings.language == languages.PYTHON\n",
    'ok = said in ("python", "ts")\n',
    'ok = "typescript" == said\n',
    'TABLE = {"python": 6, "ts": 2}\n',
])
def test_the_scan_catches_a_planted_comparison(planted):
    """Catches the scan above going blind (it would then pass whatever the package does)."""
    assert language_by_name(planted) == [1]


def test_the_scan_leaves_attributes_alone():
    """Catches the scan flagging what the language object is for (the scan would then be
    silenced rather than obeyed)."""
    clean = (
        "if language.guardable:\n    pass\n"
        "kind = RUNTIMES[language.runtime]\n"
        'versions = {"python": platform.python_version()}\n'
    )
    assert language_by_name(clean) == []


def test_every_language_is_found_by_its_name_and_its_files(tmp_path):
    """Catches a language missing from the registry, or a course opened in another language
    than its template's."""
    for language in languages.ALL:
        assert languages.by_name(language.name) is language
        assert languages.parse(language.name) is language
        root = tmp_path / language.name
        init_course(root, language)
        assert languages.by_files(root) is language
        assert (root / language.adapters).is_file() and (root / language.kvcache).is_file()
    assert open_course(tmp_path / PYTHON.name).language is PYTHON
    with pytest.raises(languages.LanguageError, match="must be one of python, ts"):
        languages.parse("rust")


def test_the_worker_is_the_given_language_s(tmp_path):
    """Catches the process's placement re-reading the course for its language on every start
    instead of using the one it was given (a Python course given TypeScript gets Node's
    worker)."""
    init_course(tmp_path / "c")
    place = Placement(Sandbox("none"), tmp_path / "c", tmp_path / "w", ("T", "t"), TYPESCRIPT)
    argv, *_ = place.command(["3", "4"], str(2**30))
    assert Path(argv[argv.index("--import") + 2]).name == TYPESCRIPT.worker
