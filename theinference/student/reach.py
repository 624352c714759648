"""Whether the student's process can write what the grader's own processes run: its Python
installation (the interpreter's folders, the site-packages its workers import from) and the
worker's scripts.

Where it can, a file it leaves there runs in a process the grader trusts: a .pth file runs in
every Python started with site processing, even under -I (the calibration and a measured call's
worker start with -S, and name their folders: launch.py), and a changed module (NumPy's own, or
the worker's) runs in them all the same. So no cost proof passes on evidence gathered there
(process.py and calibration.py refuse, saying so), and a class is never graded there
(commands/grade.py): one submission's code could change the grader of the next.

- bwrap: never (the installation is bound read-only, the student's folders are its own tmpfs);
- unprivileged-user: where a folder is writable by others (a fresh uid owns nothing, and is in
  no group);
- none: where the grader's own user can write (the student's process runs as it).
"""

import functools
import importlib.util
import os
from pathlib import Path

from theinference.student import launch, sandbox
from theinference.student.account import CANNOT_APPLY
from theinference.student.sandbox import Sandbox


def writable_install(box: Sandbox) -> tuple[str, ...]:
    """The folders and files of the grader's installation the student's process could write
    in this sandbox (none: nothing it can plant in)."""
    can_write = WRITERS[box.traits.install_writer]
    return tuple(str(p) for p in install_paths() if can_write(p))


@functools.cache
def install_paths() -> tuple[Path, ...]:
    """What a measured call's worker and the calibration run from: the interpreter's roots (a
    venv's pyvenv.cfg among them), the folders they import from, NumPy's package, and the
    worker's scripts."""
    paths = [*sandbox.python_roots(), *map(Path, launch.worker_path()), launch.WORKER_DIR]
    paths += [root / "pyvenv.cfg" for root in sandbox.python_roots()]
    numpy = importlib.util.find_spec("numpy")
    if numpy is not None and numpy.origin:
        paths.append(Path(numpy.origin).parent)
    return tuple(dict.fromkeys(p for p in paths if p.exists()))


def own_user_can_write(path: Path) -> bool:
    return os.access(path, os.W_OK)


def others_can_write(path: Path) -> bool:
    """Writable by a uid that owns nothing and is in no group: the other-write bit."""
    try:
        return bool(path.stat().st_mode & 0o002)
    except OSError:
        return False


WRITERS = {  # Traits.install_writer -> whether that writer can write a path
    "nobody": lambda path: False,  # bound read-only (bwrap)
    "others": others_can_write,  # a fresh uid that owns nothing and is in no group
    "own user": own_user_can_write,  # the grader's own user
}


def why(paths: tuple[str, ...]) -> str:
    """Why a cost proof cannot rest on what is measured where the student's process can write
    the grader's installation (`paths`, not empty)."""
    more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
    return (
        f"the student's process can write the grader's installation ({paths[0]}{more}), and a "
        "file it leaves there would run in the grader's own measurements"
    )


def refusal(paths: tuple[str, ...]) -> str:
    """Why a measured call is not made there."""
    return f"{why(paths)}: {CANNOT_APPLY}"


def note(paths: tuple[str, ...]) -> str:
    """What a run's notes say of it."""
    return (
        f"{why(paths)}: the cost checks fail saying they cannot apply (install bubblewrap, or "
        "grade as root from an installation only root can write)"
    )
