"""Where a run happened: enough to reproduce a verdict or explain a timing."""

import ctypes
import os
import platform
import sys
from pathlib import Path

from theinference import __version__


def describe() -> dict:
    """Versions and platform, for the results (not a bug fingerprint: see fingerprints.py)."""
    import numpy as np

    return {
        "theinference": __version__,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "numpy": np.__version__,
        "blas": _blas(np),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def _blas(np) -> str:
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name', '?')} {info.get('version', '')}".strip()
    except Exception:  # older NumPy, or a build that does not say
        return "unknown"


BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")  # in order


def blas_is_one_thread() -> bool:
    """Whether the grader's OpenBLAS runs one thread (cli.one_blas_thread's default; a class
    job's share may be more). With worker threads of its own, OpenBLAS's handler before a fork
    joins them, and a fork made (a student process started) while the planner's thread is
    inside OpenBLAS hangs there for good: plans are then made by each case, not beside. The
    variables are read when NumPy loads: where it loaded before they were set (a notebook, a
    script importing the grader), the library's own count decides."""
    said = next((v for n in BLAS_THREAD_VARS if (v := os.environ.get(n, "").strip())), "")
    return said == "1" and openblas_threads() in (1, None)


def openblas_threads() -> int | None:
    """The thread count of the OpenBLAS NumPy has loaded (its wheel's own build); None where
    NumPy is not loaded yet (the variables will hold) or its BLAS is another."""
    if "numpy" not in sys.modules:
        return None
    import numpy

    for path in (Path(numpy.__file__).parent.parent / "numpy.libs").glob("*openblas*"):
        library = ctypes.CDLL(str(path))
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads"):
            if hasattr(library, name):
                return int(getattr(library, name)())
    return None
