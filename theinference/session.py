"""What `theinference test` does once: prepare, grade, report, write results.

Watch mode (watch.py) calls the same `run` for every rerun, so a watched run and a single run
can never disagree.
"""

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from theinference import exits, languages
from theinference.answer_cache import AnswerCache
from theinference.course import Course, open_course
from theinference.events import Listener, ignore
from theinference.grader import Oracle, grade
from theinference.results import RunResult
from theinference.runner import Limits
from theinference.sandbox import Sandbox, choose
from theinference.stages import Stage, load_stages, select, with_hidden_cases
from theinference.weights import Weights, cache_dir, load_weights


@dataclass(frozen=True)
class Output:
    format: str  # terminal | json | junit | gradescope
    path: Path | None  # None: stdout


@dataclass
class Session:
    course: Course
    stages: list[Stage]  # the selected ones, hidden cases included
    all_stages: list[Stage]  # for "run all" in watch mode
    weights: Weights
    limits: Limits = field(default_factory=Limits)
    outputs: list[Output] = field(default_factory=lambda: [Output("terminal", None)])
    oracle: Oracle | None = None  # kept across watch reruns: answers stay in memory
    sandbox: Sandbox | None = None  # how the student's process runs (sandbox.choose)


def prepare(
    course_dir: Path,
    slugs: list[str],
    weights_spec: str | None,
    timeout: float | None,
    seed: int | None,
    outputs: list[Output],
    case_filter: list[str] = (),
    sandbox_mode: str = "auto",
) -> Session:
    """Everything a run needs, checked up front: course, stages, weights."""
    course = open_course(course_dir)
    every = load_stages()
    if case_filter:
        every = [only_cases(s, case_filter) for s in every]
    if timeout is not None:
        every = [replace(s, timeout=timeout) for s in every]
    else:  # a stage's own timeout, scaled for a language slower than NumPy
        factor = languages.TIMEOUT_FACTOR[course.language]
        every = [replace(s, timeout=s.timeout * factor) for s in every]
    if seed is not None:
        every = [with_hidden_cases(s, seed) for s in every]
    sandbox = choose(sandbox_mode, course.root)
    weights = load_weights(weights_spec or course.weights, course.root)
    sandbox.notes.extend(weights.notes)
    oracle = Oracle(weights, AnswerCache(weights.sha256, cache_dir()))
    return Session(
        course,
        select(every, slugs),
        every,
        weights,
        outputs=outputs,
        oracle=oracle,
        sandbox=sandbox,
    )


def override_limits(session: Session, memory_gb: float | None, output_kb: int | None) -> None:
    """Limits given on the command line win over every stage spec's."""
    changes = {}
    if memory_gb is not None:
        changes["memory_bytes"] = int(memory_gb * 2**30)
    if output_kb is not None:
        changes["output_bytes"] = int(output_kb * 1024)
    if changes:
        session.stages = [replace(s, **changes) for s in session.stages]
        session.all_stages = [replace(s, **changes) for s in session.all_stages]


def only_cases(stage: Stage, wanted: list[str]) -> Stage:
    """The stage with only the cases whose names contain one of `wanted`."""
    keep = tuple(c for c in stage.cases if any(w.lower() in c.name.lower() for w in wanted))
    return replace(stage, cases=keep)


def run(
    session: Session,
    stages: list[Stage] | None = None,
    cancel: threading.Event | None = None,
    trigger: str = "",
    listener: Listener = ignore,
) -> RunResult:
    """Grade, then hand the result to every requested output."""
    from theinference import report
    from theinference.environment import fingerprint
    from theinference.progress import record_progress

    stages = stages or session.stages
    terminal = report.console() if _wants_terminal(session) else None
    if terminal:
        report.print_header(
            terminal,
            str(session.course.root),
            session.weights.label,
            [s.slug for s in stages],
            trigger,
        )
    result = grade(
        session.course.root,
        stages,
        session.weights,
        session.limits,
        session.oracle,
        cancel,
        languages.localizing(listener, session.course.language),
        session.sandbox,
    )
    result = languages.localize_result(result, session.course.language)  # decodeStep in TS
    result.environment = fingerprint()
    result.notes = [*result.notes, *session.oracle.cache.notes]
    if result.cancelled:
        return result
    if terminal:
        report.print_run(terminal, result)
    write_outputs(session.outputs, result)
    record_progress(session.course.root, result)
    return result


def _wants_terminal(session: Session) -> bool:
    return any(o.format == "terminal" for o in session.outputs)


def write_outputs(outputs: list[Output], result: RunResult) -> None:
    from theinference.formats import render, write_atomically

    for out in outputs:
        if out.format == "terminal":
            continue
        text = render(result, out.format)
        if out.path is None:
            print(text)
        else:
            write_atomically(out.path, text + "\n")


def exit_code(result: RunResult) -> int:
    return exits.OK if result.passed else exits.NOT_PASSED


def run_once(session: Session) -> int:
    return exit_code(run(session))
