"""The course notebook as tests use it: filled in with a solution, run by a real kernel."""

import ast
import os

import nbformat
from nbclient import NotebookClient

from theinference.notebook.course import course_notebook

DEFINITIONS = (ast.FunctionDef, ast.ClassDef)


def definitions(text: str) -> tuple[list[str], dict[str, str]]:
    """A solution's imports (sources) and each of its functions and classes by name."""
    tree, lines = ast.parse(text), text.splitlines()
    imports, named = [], {}
    for node in tree.body:
        source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        if isinstance(node, DEFINITIONS):
            named[node.name] = source
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(source)
    return imports, named


def defined_names(source: str) -> list[str]:
    try:
        return [n.name for n in ast.parse(source).body if isinstance(n, DEFINITIONS)]
    except SyntaxError:  # a magic
        return []


def in_memory() -> nbformat.NotebookNode:
    """The course notebook as `init --notebook` writes it, never written to disk."""
    return nbformat.from_dict(course_notebook())


def filled(nb: nbformat.NotebookNode, solution: str, through: str | None = None,
           setup: str = "") -> nbformat.NotebookNode:
    """The course notebook with each stub cell replaced by the solution's definitions of the
    same names, its helpers beside the cache's classes, its imports in the imports cell; cut
    after the check cell of stage `through`. `setup` is added to the setup cell (e.g.
    configure(quick=True))."""
    imports, named = definitions(solution)
    stubbed = {name for cell in nb.cells if cell.cell_type == "code"
               for name in defined_names(cell.source)}
    helpers = [source for name, source in named.items() if name not in stubbed]
    first_defs = True
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.source.startswith("%load_ext"):
            cell.source += "\n" + setup
        elif cell.source.startswith("import numpy"):
            cell.source = "\n".join(imports)
        elif names := defined_names(cell.source):
            extra = helpers if first_defs else []
            cell.source = "\n\n\n".join([*(named[n] for n in names), *extra])
            first_defs = False
    if through is not None:
        end = next(i for i, c in enumerate(nb.cells) if c.source == f'check("{through}")')
        nb.cells = nb.cells[: end + 1]
    return nb


def execute(nb: nbformat.NotebookNode, cwd, timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel (this Python's), in `cwd`; a cell that raises fails
    the run."""
    env_note = os.environ.get("THEINFERENCE_CACHE_DIR")  # the kernel inherits it
    assert env_note, "the weights cache must be set up first (the `weights` fixture)"
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def check_outputs(nb: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """Each check cell's (source, HTML, text) in order."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not ("check(" in cell.source
                                            or cell.source.startswith("%%check")):
            continue
        shown = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert shown, (cell.source, cell.outputs)
        data = shown[-1].data
        found.append((cell.source, data.get("text/html", ""), data.get("text/plain", "")))
    return found


def verdict(html: str) -> str:
    """The fragment's verdict: PASSED or NOT PASSED (or cannot check)."""
    for word in ("NOT PASSED", "PASSED", "cannot check"):
        if word in html:
            return word
    raise AssertionError(html[:500])
