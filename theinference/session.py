"""What `theinference test` does once, and the watch loop around exactly that.

Watch mode calls the same `grade_and_report` as a single run, so the two can never disagree.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from theinference import exits
from theinference.course import Course, open_course
from theinference.runner import Limits
from theinference.stages import Stage, load_stages, select
from theinference.weights import Weights, load_weights

WATCHED_SUFFIXES = (".py", ".toml")
IGNORED_PARTS = {"__pycache__", ".git", ".venv", "venv", ".mypy_cache", ".pytest_cache"}


@dataclass(frozen=True)
class Session:
    course: Course
    stages: list[Stage]
    weights: Weights
    limits: Limits
    timeout_override: float | None


def prepare(
    course_dir: Path, slugs: list[str], weights_spec: str | None, timeout: float | None
) -> Session:
    """Everything a run needs, checked up front: course, stages, weights."""
    course = open_course(course_dir)
    stages = select(load_stages(), slugs)
    weights = load_weights(weights_spec or course.weights, course.root)
    return Session(course, stages, weights, Limits(), timeout)


def grade_and_report(session: Session) -> int:
    from theinference.grader import grade
    from theinference.report import console, print_header, print_run

    out = console()
    stages = session.stages
    if session.timeout_override is not None:
        from dataclasses import replace

        stages = [replace(s, timeout=session.timeout_override) for s in stages]
    print_header(out, str(session.course.root), session.weights.label, [s.slug for s in stages])
    run = grade(session.course.root, stages, session.weights, session.limits)
    print_run(out, run)
    return exits.OK if run.passed else exits.NOT_PASSED


def run_once(session: Session) -> int:
    return grade_and_report(session)


def is_watched(path: Path) -> bool:
    """Source and settings files only: not editor swap files, caches or bytecode."""
    name = path.name
    if name.startswith((".", "#")) or name.endswith(("~", ".swp", ".swx", ".tmp")):
        return False
    if IGNORED_PARTS.intersection(path.parts):
        return False
    return name.endswith(WATCHED_SUFFIXES)


def snapshot(root: Path) -> dict[Path, str]:
    """Content hashes of the watched files: a save that changes nothing triggers nothing."""
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and is_watched(rel):
            try:
                out[rel] = hashlib.sha1(path.read_bytes()).hexdigest()
            except OSError:
                continue
    return out


def changed_files(before: dict[Path, str], after: dict[Path, str]) -> list[Path]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def watch_loop(session: Session) -> int:
    """Grade, then regrade whenever a watched file's content changes. Ctrl-C ends it."""
    from watchfiles import watch

    from theinference.report import console

    out = console()
    root = session.course.root
    grade_and_report(session)
    state = snapshot(root)
    out.print("[dim]watching for changes (Ctrl-C to quit)[/]")

    def relevant(_change, path: str) -> bool:
        return is_watched(Path(path).relative_to(root))

    for _ in watch(root, watch_filter=relevant, debounce=300, raise_interrupt=False):
        now = snapshot(root)
        changed = changed_files(state, now)
        state = now
        if not changed:
            continue
        out.rule(f"changed: {', '.join(str(p) for p in changed)}")
        grade_and_report(session)
        out.print("[dim]watching for changes (Ctrl-C to quit)[/]")
    return exits.INTERRUPTED  # the watcher ends only on Ctrl-C
