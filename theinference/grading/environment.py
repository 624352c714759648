"""Where a run happened: enough to reproduce a verdict or explain a timing."""

import platform
import sys

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
