"""The sandbox is one object, chosen once: what differs between its kinds is stated by its
Traits in theinference/student/sandbox.py, and how each kind starts the worker in placement.py;
no other module tells the kinds apart by their names."""

import ast
from pathlib import Path

import pytest

import theinference
from theinference.student import sandbox

PACKAGE = Path(theinference.__file__).parent
SANDBOX_MODULES = {PACKAGE / "student" / "sandbox.py", PACKAGE / "student" / "placement.py"}
KINDS = set(sandbox.TRAITS)
ONLY_SANDBOX = KINDS - {"none"}  # "none" is an account kind's and a seed source's word too


def mentions_sandbox(node: ast.AST) -> bool:
    return any(word in ast.unparse(node) for word in ("sandbox", "box", "chosen"))


def kind_by_name(source: str) -> list[int]:
    """Lines that compare with a sandbox kind's name (none only where the other side is a
    sandbox's), or hold a table keyed by kinds' names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = [s for s in sides if literal_kind(s) in ONLY_SANDBOX]
            nones = [s for s in sides if literal_kind(s) == "none"]
            if names or (nones and any(mentions_sandbox(s) for s in sides if s not in nones)):
                found.append(node.lineno)
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None and literal_kind(k) in KINDS]
            if len(keys) > 1:
                found.append(node.lineno)
    return found


def literal_kind(node: ast.AST) -> str | None:
    """The kind a literal names (in a tuple, list or set too), else None."""
    if isinstance(node, ast.Constant) and node.value in KINDS:
        return node.value
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return next((k for k in map(literal_kind, node.elts) if k is not None), None)
    return None


def test_no_module_tells_sandbox_kinds_apart_by_name():
    """Catches an `if sandbox.kind == "bwrap":` branch or a {"bwrap": ..., "none": ...} table
    added outside the sandbox's modules: a new kind (a container runtime, a remote runner)
    would then have to find and edit it, instead of stating its Traits once."""
    found = {
        p.relative_to(PACKAGE).as_posix(): lines
        for p in PACKAGE.rglob("*.py")
        if p not in SANDBOX_MODULES and (lines := kind_by_name(p.read_text()))
    }
    assert not found, found


@pytest.mark.parametrize("planted", [
    'if sandbox.kind == "bwrap":\n    pass\n',
    'if self.sandbox != "unprivileged-user":\n    pass\n',
    'ok = chosen.kind == "none"\n',
    'ok = kind in ("bwrap", "unprivileged-user")\n',
    'TABLE = {"bwrap": 2, "none": 0}\n',
])
def test_the_scan_catches_a_planted_comparison(planted):
    """Catches the scan above going blind (it would then pass whatever the package does)."""
    assert kind_by_name(planted) == [1]


def test_every_kind_states_every_trait():
    """Catches a kind added to the modes without its Traits, or Traits a kind leaves unset:
    every part of the grader reads a kind through them."""
    assert set(sandbox.MODES) - {"auto"} == KINDS
    strengths = sorted(t.strength for t in sandbox.TRAITS.values())
    assert strengths == list(range(len(KINDS)))  # an order, each kind its own place
    for traits in sandbox.TRAITS.values():
        assert traits.install_writer in ("nobody", "others", "own user")
