"""Helpers the tests share: course directories from the real template, grading as the CLI does."""

from dataclasses import replace
from pathlib import Path

SOLUTIONS = Path(__file__).parent / "solutions"


def make_course(root: Path, kvcache: str | None = None) -> Path:
    from theinference.course import init_course

    init_course(root)
    if kvcache is not None:
        (root / "src" / "kvcache.py").write_text(kvcache)
    return root


def reference_text() -> str:
    return (SOLUTIONS / "reference_kvcache.py").read_text()


def grade_course(
    course: Path, weights, slugs: list[str] | None = None, timeout: float = 60, oracle=None
):
    """Grade through the same path as the CLI, returning the RunResult."""
    from theinference.grader import grade
    from theinference.runner import Limits
    from theinference.stages import load_stages, select

    stages = [replace(s, timeout=timeout) for s in select(load_stages(), slugs or [])]
    return grade(course, stages, weights, Limits(timeout=timeout), oracle)


def statuses(run) -> dict[str, str]:
    return {s.slug: s.status.value for s in run.stages}
