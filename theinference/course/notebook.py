"""A notebook as a course: which of its code is the student's, as a course directory's files.

The rule (docs/notebooks.md), the same for a kernel's cells and an .ipynb's: code cells in
order (a kernel's in the order they ran), and from each, its top-level `def`, `class`, `import`
(a `try` of imports too) and constant (an assignment whose value calls nothing, `EPS = 1e-5`),
and any assignment to a name those read (`W = load_weights()` that a function uses). Everything
else is left out: calls, prints, loops, experiments, `check(...)` cells, magics and shell
lines, so grading never runs what a notebook only tries out. A `%%check` cell counts its body;
another cell magic (`%%bash`, `%%time`...) is not Python and is skipped, and so is a cell that
does not parse, as the kernel ran none of it. Imports of theinference, IPython and google.colab
are left out (the student's process has none of them).

What is kept goes after the template's stubs, as src/kvcache.py: a definition replaces the stub
of its name, a function the notebook does not define stays a stub (`todo`). The adapters are
the template's; a notebook that defines one of them (`run_prefill`...) is wired to its own.
"""

import ast
import json
import re
from dataclasses import dataclass, field

from theinference.course import languages

KVCACHE = "src/kvcache.py"
ADAPTERS = "tests/adapters.py"
NOTEBOOK_SUFFIX = ".ipynb"
LEFT_OUT_IMPORTS = ("theinference", "IPython", "google")
MAGIC_LINE = re.compile(r"^\s*[%!]", re.MULTILINE)
CHECK_MAGIC = "%%check"


class NotebookError(Exception):
    """A notebook that cannot be read as one; the message says why."""


@dataclass
class Extracted:
    """The code a notebook's cells define: the source kept, the names it defines (functions
    and classes) and the cells skipped because they do not parse."""

    code: str = ""
    names: list[str] = field(default_factory=list)
    unparsable: list[str] = field(default_factory=list)  # the cells' labels


def extract(cells: list[tuple[str, str]]) -> Extracted:
    """The rule, over (label, source) code cells in order; a label names the cell in the
    code kept (`# cell 3`), so a traceback's line can be found in the notebook."""
    found = Extracted()
    parsed = []  # (label, lines, top-level statements)
    for label, source in cells:
        python = cell_python(source)
        if python is None:
            continue
        try:
            parsed.append((label, python.splitlines(), ast.parse(python).body))
        except (SyntaxError, ValueError):
            found.unparsable.append(label)
    statements = [node for _, _, body in parsed for node in body]
    kept = kept_statements(statements)
    chunks = []
    for label, lines, body in parsed:
        sources = [statement_source(node, lines) for node in body if id(node) in kept]
        found.names += [n.name for n in body if isinstance(n, DEFINITIONS)]
        if sources:
            chunks.append(f"# {label}\n" + "\n\n".join(sources))
    found.code = "\n\n\n".join(chunks)
    return found


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def kept_statements(statements: list[ast.stmt]) -> set[int]:
    """The ids of the statements kept: definitions, imports and constants, then every
    assignment to a name they (or an assignment so kept) read, until none is added."""
    kept = {id(node) for node in statements if kept_statement(node)}
    assignments = [n for n in statements if isinstance(n, ast.Assign | ast.AnnAssign)
                   and n.value is not None and id(n) not in kept]
    while True:
        read = {name for node in statements if id(node) in kept for name in names_read(node)}
        used = [n for n in assignments if id(n) not in kept and assigned(n) & read]
        if not used:
            return kept
        kept |= {id(n) for n in used}


def names_read(node: ast.AST) -> set[str]:
    """The names a statement reads from the module: a function's own parameters and locals
    are its own (`logits` inside prefill is not the notebook's `logits = prefill(...)`)."""
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return set().union(*map(names_read, ast.iter_child_nodes(node)))
    args = node.args
    at_definition = [*getattr(node, "decorator_list", []), *args.defaults,
                     *(d for d in args.kw_defaults if d is not None)]
    body = node.body if isinstance(node.body, list) else [node.body]
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    own = {a.arg for a in params if a is not None} | {
        n.id if isinstance(n, ast.Name) else n.name
        for statement in body for n in ast.walk(statement)
        if (isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load))
        or isinstance(n, DEFINITIONS)}
    inside = set().union(*map(names_read, body)) - own
    return inside | set().union(*map(names_read, at_definition))


def assigned(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def cell_python(source: str) -> str | None:
    """The cell as Python: magic and shell lines blanked (line numbers kept), a `%%check`
    cell's body, None for any other cell magic."""
    lines = source.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        if lines[first].split()[0] != CHECK_MAGIC:
            return None
        lines[first] = ""
    return "\n".join("" if MAGIC_LINE.match(line) else line for line in lines)


def kept_statement(node: ast.stmt) -> bool:
    if isinstance(node, DEFINITIONS):
        return True
    if isinstance(node, ast.Import):
        return not any(left_out(a.name) for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and not left_out(node.module or "")
    if isinstance(node, ast.Assign | ast.AnnAssign):
        return node.value is not None and not calls(node.value)
    if isinstance(node, ast.Try):  # try: import torch / except ImportError: ...
        parts = [*node.body, *node.orelse, *node.finalbody,
                 *(s for handler in node.handlers for s in handler.body)]
        return all(isinstance(s, ast.Pass) or kept_statement(s) for s in parts)
    return False


def left_out(module: str) -> bool:
    return module.split(".")[0] in LEFT_OUT_IMPORTS


def calls(node: ast.AST) -> bool:
    """Whether evaluating the expression calls anything (a lambda's body runs later)."""
    if isinstance(node, ast.Lambda):
        return False
    if isinstance(node, ast.Call):
        return True
    return any(calls(child) for child in ast.iter_child_nodes(node))


def statement_source(node: ast.stmt, lines: list[str]) -> str:
    """A top-level statement's own lines, its decorators and comments inside it included."""
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    return "\n".join(lines[start - 1 : node.end_lineno])


def course_files(found: Extracted) -> dict[str, bytes]:
    """The course directory's files for this code: the stubs then the notebook's definitions
    as src/kvcache.py, and the adapters wired to any of them the notebook defines."""
    template = languages.DEFAULT.template
    stubs = (template / KVCACHE).read_text()
    kvcache = f"{stubs}\n\n# --- the notebook's code ---------------------------------------\n\n"
    files = {KVCACHE: (kvcache + found.code + "\n").encode()}
    adapters = (template / ADAPTERS).read_text()
    own = [name for name in found.names if name in adapter_names(adapters)]
    if own:  # the notebook's own wiring, imported over the template's
        adapters += f"\n\nfrom src.kvcache import {', '.join(own)}  # noqa: E402, F811\n"
    files[ADAPTERS] = adapters.encode()
    return files


def adapter_names(adapters: str) -> set[str]:
    return {n.name for n in ast.parse(adapters).body if isinstance(n, ast.FunctionDef)
            and n.name.startswith("run_")}


def notebook_cells(data: bytes) -> list[tuple[str, str]]:
    """An .ipynb's code cells as (label, source), in document order."""
    try:
        notebook = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotebookError(f"not a readable notebook: its JSON is malformed ({exc})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise NotebookError("not a readable notebook: no list of cells (nbformat 4 expected)")
    code = []
    for index, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise NotebookError(f"not a readable notebook: cell {index}'s source is not text")
        code.append((f"cell {index}", source))
    return code


def notebook_course_files(data: bytes) -> dict[str, bytes]:
    """An .ipynb's code as a course directory's files; a notebook that defines no function
    or class has nothing to grade, and says so."""
    cells = notebook_cells(data)
    found = extract(cells)
    if not found.names:
        where = f"{len(cells)} code cells" if cells else "no code cell"
        raise NotebookError(
            f"the notebook defines no function or class to grade ({where}): was the right "
            "notebook submitted, and saved?"
        )
    return course_files(found)
