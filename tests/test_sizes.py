"""The sizes the codebase keeps, held: no module over 300 lines, no function body over 50 (a
command's option declarations are its signature, not its body), and no function, method or
class nothing uses (vulture, with the tests and benchmarks counted as users)."""

import ast
from pathlib import Path

import theinference

PACKAGE = Path(theinference.__file__).parent
ROOT = PACKAGE.parent
MODULE_LINES = 300
FUNCTION_LINES = 50
# registered by a decorator, called by a framework, or the student's template: used, though
# nothing names them in code
REGISTERED = ["@check", "@*.command", "@app.command", "@pytest.fixture", "@contextmanager"]
# called by pytest by name: the pytest plugin's hooks and its nodes' methods
PYTEST_CALLS = ["pytest_*", "runtest", "reportinfo"]


def package_modules() -> list[Path]:
    templates = PACKAGE / "course" / "templates"
    return [p for p in PACKAGE.rglob("*.py") if templates not in p.parents]


def test_no_module_is_over_the_size_the_codebase_keeps():
    """Catches a module grown past ~300 lines (split it where its parts differ)."""
    big = {
        p.relative_to(PACKAGE).as_posix(): n
        for p in package_modules()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert not big, big


def test_no_function_body_is_over_the_size_the_codebase_keeps():
    """Catches a function grown past ~50 lines of body."""
    long = {}
    for path in package_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.body[0].lineno + 1
                if lines > FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"] = lines
    assert not long, long


def test_no_function_is_unused():
    """Catches dead code: a function, method or class of the package that nothing calls (a
    fallback to a module that no longer exists, a helper whose caller went)."""
    from vulture import Vulture

    vulture = Vulture(ignore_decorators=REGISTERED, ignore_names=["test_*", *PYTEST_CALLS])
    vulture.scavenge(
        [str(PACKAGE), str(ROOT / "tests"), str(ROOT / "benchmarks")],
        exclude=[str(PACKAGE / "course" / "templates"), str(ROOT / "tests" / "solutions")],
    )
    unused = [
        f"{Path(item.filename).relative_to(ROOT)}:{item.first_lineno} {item.name}"
        for item in vulture.get_unused_code(min_confidence=60)
        if item.typ in ("function", "method", "class") and PACKAGE in Path(item.filename).parents
    ]
    assert not unused, unused
