"""Every check a stage spec can name, by name."""

from theinference.checks import generation, seed_stages
from theinference.checks.common import Check, OracleRuns, Verdict

CHECKS: dict[str, Check] = {**seed_stages.CHECKS, **generation.CHECKS}

__all__ = ["CHECKS", "Check", "OracleRuns", "Verdict"]
