"""The grader's own modules compiled once, where nothing else would keep their bytecode.

Python keeps a module's bytecode beside it (`__pycache__`) the first time it imports it, unless
told not to (PYTHONDONTWRITEBYTECODE, which many container images set); an editable install,
or one made by uv, holds none, and the worker's own parts are loaded inside the sandbox, which
never writes any. Every command then compiled the grader's modules again, and every student
process the worker's: a few tenths of a second of each run, which a short stage's save felt.
The first command writes them where the install is writable (as `python -m compileall` would);
Python reads them from then on, checking each against its source as always.
"""

import compileall
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
MARK = PACKAGE / "student" / "worker" / "__pycache__"  # the last place anything else writes


def compiled_once() -> None:
    """Compile the package's modules if they have not been (nothing where it cannot write)."""
    if MARK.is_dir():
        return
    try:
        compileall.compile_dir(PACKAGE, quiet=2, workers=1)
    except OSError:  # a read-only install: each run compiles, as before
        pass
