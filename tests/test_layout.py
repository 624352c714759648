"""The package's layers and the directions they may import in (the "Layout" table of
docs/development.md)."""

import ast
from pathlib import Path

import theinference

PACKAGE = Path(theinference.__file__).parent
SHARED = {"__init__", "__version__", "exits", "atomic"}  # the package's own small modules

# layer -> the layers it may import from (None: any)
ALLOWED: dict[str, set[str] | None] = {
    "cli": None,
    "__main__": None,
    "notebook": None,  # a front end, as the command line is: checks from a notebook's kernel
    "__init__": {"notebook"},  # `%load_ext theinference` hands over to the notebook's
    "commands": None,
    "classroom": {"results", "grading", "curriculum", "course", "oracle", "student", "diagnosis"},
    "output": {"results", "grading", "course", "curriculum"},
    "grading": {"diagnosis", "curriculum", "student", "oracle", "course", "results"},
    "diagnosis": {"curriculum", "oracle", "results"},
    "curriculum": {"oracle", "course", "results", "student"},
    "student": {"course", "oracle"},
    "oracle": set(),
    "course": set(),
    "results": set(),
}
def package_modules() -> list[Path]:
    templates = PACKAGE / "course" / "templates"
    return [p for p in PACKAGE.rglob("*.py") if templates not in p.parents]


def imported_layers(path: Path) -> set[str]:
    """The first component under theinference of every module this file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] == "theinference":
                found |= {a.name for a in node.names} if len(parts) == 1 else {parts[1]}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("theinf")}
    return found


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_every_module_sits_in_a_known_layer():
    """Catches a module added beside the layers instead of in one of them."""
    for path in package_modules():
        assert layer_of(path) in ALLOWED or layer_of(path) in SHARED, path


def test_layers_import_only_downwards():
    """Catches an import that makes a lower layer depend on a higher one (e.g. the oracle on
    grading, or the terminal report on the diagnosis it should only read)."""
    wrong = set()
    for path in package_modules():
        layer = layer_of(path)
        allowed = ALLOWED.get(layer, set())
        if allowed is None:
            continue
        for other in imported_layers(path) - SHARED - {layer}:
            if other not in allowed:
                wrong.add((path.relative_to(PACKAGE).as_posix(), other))
    assert not wrong, sorted(wrong)


def test_only_the_output_layer_imports_rich():
    """Catches drawing code outside output/ (every format must be able to carry what the
    terminal shows)."""
    for path in package_modules():
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
        if "rich" in names:
            assert layer_of(path) == "output", path


def test_the_worker_imports_nothing_of_the_grader():
    """Catches the student's process loading the oracle or the grader (it runs with -P and
    must see none of it)."""
    for path in (PACKAGE / "student" / "worker").glob("*.py"):
        assert not imported_layers(path), path
