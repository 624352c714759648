"""The grader's own modules compiled once (theinference/commands/bytecode.py)."""

import importlib.util
import shutil
from pathlib import Path

from theinference.commands import bytecode


def copy_of_the_package(tmp_path, monkeypatch):
    package = tmp_path / "theinference"
    shutil.copytree(bytecode.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bytecode, "PACKAGE", package)
    monkeypatch.setattr(bytecode, "MARK", package / "student" / "worker" / "__pycache__")
    return package


def test_the_first_command_keeps_the_bytecode_python_was_told_not_to_write(
    tmp_path, monkeypatch
):
    """Catches every command compiling the grader's modules again where PYTHONDONTWRITEBYTECODE
    is set (a few tenths of a second of each save), and the worker's parts, which the sandbox
    never lets write theirs, compiled in every student process."""
    package = copy_of_the_package(tmp_path, monkeypatch)
    worker = package / "student" / "worker" / "probes.py"
    assert not any(package.rglob("*.pyc"))
    bytecode.compiled_once()
    assert Path(importlib.util.cache_from_source(str(worker))).is_file()
    assert sum(1 for _ in package.rglob("*.pyc")) >= sum(1 for _ in package.rglob("*.py")) - 5



def test_every_command_begins_by_it(monkeypatch):
    """Catches the command line no longer asking for it (each save compiling again)."""
    from theinference import cli

    asked = []
    monkeypatch.setattr(cli, "compiled_once", lambda: asked.append(True))
    monkeypatch.setattr(cli, "app", lambda: None)
    cli.main()
    assert asked == [True]
