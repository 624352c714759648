"""Every check a stage spec can name, by name: each stage's checks live in the module named
after it (checks/build_prefill.py for build-prefill) and register themselves when imported."""

import importlib
import pkgutil

from theinference.curriculum.checks.common import CHECKS, Check, Verdict

SHARED = {"common", "values", "floor", "swap"}  # helpers, not stages

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in SHARED:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["CHECKS", "Check", "Verdict"]
