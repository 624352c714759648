"""The sizes the codebase keeps, held: no module over 300 lines, no function body over 50 (a
command's option declarations are its signature, not its body), and no function, method or
class nothing uses (vulture, with the tests and benchmarks counted as users). The package's
JavaScript and TypeScript (the Node worker) are held to the same sizes, their functions found
without a parser (see js_function_bodies); the student's templates are theirs, not held."""

import ast
import re
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


def package_modules(pattern: str = "*.py") -> list[Path]:
    templates = PACKAGE / "course" / "templates"
    return [
        p
        for p in PACKAGE.rglob(pattern)
        if templates not in p.parents and "node_modules" not in p.parts
    ]


def script_modules() -> list[Path]:
    """The package's own JavaScript and TypeScript (the Node worker's modules)."""
    return [p for pattern in ("*.mjs", "*.js", "*.ts", "*.mts") for p in package_modules(pattern)]


def test_no_module_is_over_the_size_the_codebase_keeps():
    """Catches a module grown past ~300 lines (split it where its parts differ)."""
    big = {
        p.relative_to(PACKAGE).as_posix(): n
        for p in package_modules() + script_modules()
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


PARAMETERS = 6  # past this, a function's arguments belong together in one value


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter a caller may pass, `self` and `cls` aside."""
    a = node.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    count = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return count - (bool(names) and names[0].arg in ("self", "cls"))


def test_no_function_outside_the_commands_takes_more_than_six_parameters():
    """Catches a run's setup travelling as loose arguments again (a course, weights, limits,
    sandbox, cancel... passed one by one): only the command line's own functions, whose
    parameters are its options, may take more."""
    wide = {}
    for path in package_modules():
        if path.relative_to(PACKAGE).parts[0] == "commands":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and (n := parameter_count(node)) > PARAMETERS:
                wide[f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"] = n
    assert not wide, wide


def test_the_parameter_count_sees_every_kind_of_parameter():
    """Catches a count that misses keyword-only, *args or **kwargs parameters (a function
    could then grow past the limit unseen)."""
    (node,) = ast.parse("def f(self, a, /, b, *c, d, e=1, **f): pass").body
    assert parameter_count(node) == 6


# A JavaScript function's start: a `function` declaration or expression, a block-bodied arrow,
# or a method (a name, its parameters and a brace that ends the line; not a control statement)
JS_FUNCTION = re.compile(
    r"\bfunction\b[\s*\w$]*\(|=>\s*\{"
    r"|^\s*(?:static\s+|async\s+|get\s+|set\s+)*\*?(?!(?:if|for|while|switch|catch|with)\b)"
    r"[A-Za-z_$][\w$]*\s*\(.*\)\s*\{\s*$"
)
# what cannot hold a brace that counts: strings, template text, line comments
JS_NOT_CODE = re.compile(r"//.*$|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"|`(?:\\.|[^`\\])*`")


def js_function_bodies(text: str) -> list[tuple[int, int]]:
    """(line number, body lines) of every function whose body runs past its first line: from
    the line a function starts on, braces are counted (outside strings and comments) until the
    block it leaves open closes; its body is the lines between."""
    lines = [JS_NOT_CODE.sub("", line) for line in text.splitlines()]
    bodies = []
    for start, line in enumerate(lines):
        if not JS_FUNCTION.search(line):
            continue
        depth = 0
        for end in range(start, len(lines)):
            depth += lines[end].count("{") - lines[end].count("}")
            if depth <= 0:
                break
        if end > start:
            bodies.append((start + 1, end - start - 1))
    return bodies


def test_no_script_function_body_is_over_the_size_the_codebase_keeps():
    """Catches a function of the Node worker grown past ~50 lines of body, and a measure that
    finds no functions there (which would let any size through)."""
    measured = {p: js_function_bodies(p.read_text()) for p in script_modules()}
    assert sum(map(len, measured.values())) >= 20, measured  # the worker has dozens
    long = {
        f"{p.relative_to(PACKAGE).as_posix()}:{line}": n
        for p, bodies in measured.items()
        for line, n in bodies
        if n > FUNCTION_LINES
    }
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
