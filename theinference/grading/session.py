"""What `theinference test` does once: prepare, grade, write results.

The run itself never prints: whoever draws (the terminal, watch mode) listens to its events
and reads its result. Watch mode (watch.py) calls the same `run` for every rerun, so a watched
run and a single run can never disagree.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from theinference import exits
from theinference.course import languages
from theinference.course.directory import SETTINGS_FILE, Course, open_course
from theinference.curriculum.stages import Stage, StageError, load_stages, select, with_hidden_cases
from theinference.grading.answers import Answers
from theinference.grading.grader import grade
from theinference.grading.policy import EVERY_CASE, RunPolicy, selected
from theinference.grading.provenance import provenance, test_seed_source, with_run
from theinference.grading.speed import speed_after
from theinference.oracle.weights import Weights, load_weights
from theinference.results import RunResult
from theinference.results.events import Event, Listener, ignore
from theinference.student.process import Limits
from theinference.student.sandbox import Sandbox, choose

Renderer = Callable[[str, threading.Event | None], Listener]  # (trigger, cancel) -> drawing
Writer = Callable[[RunResult], None]  # writes a finished run's machine outputs


@dataclass(frozen=True)
class Output:
    format: str  # a name in formats.FORMATS
    path: Path | None  # None: stdout


@dataclass
class Session:
    course: Course
    stages: list[Stage]  # the selected ones, hidden cases included
    all_stages: list[Stage]  # for "run all" in watch mode
    weights: Weights
    limits: Limits = field(default_factory=Limits)
    outputs: list[Output] = field(default_factory=list)
    answers: Answers | None = None  # kept across watch reruns: answers stay in memory
    policy: RunPolicy = EVERY_CASE
    renderer: Renderer | None = None  # draws each run (the terminal); None: nothing drawn
    writer: Writer | None = None  # writes `outputs` (output/formats.py); None: nothing written
    sandbox: Sandbox | None = None  # how the student's process runs (sandbox.choose)
    seed: int | None = None  # --seed: hidden cases and the cache-use proofs' arguments
    provenance: dict = field(default_factory=dict)  # what produces the grade (provenance.py)
    speed: bool = False  # also time the cached generation against the oracle's (speed.py)


def prepare(
    course_dir: Path,
    slugs: list[str],
    weights_spec: str | None,
    timeout: float | None,
    seed: int | None,
    outputs: list[Output],
    policy: RunPolicy = EVERY_CASE,
    sandbox_mode: str = "auto",
    speed: bool = False,
) -> Session:
    """Everything a run needs, checked up front: course, stages, case filter, sandbox,
    weights."""
    course = open_course(course_dir)
    every = course_stages(timeout, seed)
    chosen = select(every, slugs)
    if policy.cases:
        chosen = filtered(chosen, policy.cases, named=bool(slugs))
    sandbox = choose(sandbox_mode)
    weights = load_weights(weights_spec or course.weights, course.root)
    sandbox.notes.extend(weights.notes)
    # as the grader's own user, the student's process could read the cache's secret: answers
    # then stay in memory, and the secret is replaced after each run (see `run`)
    answers = Answers.in_memory(weights) if sandbox.kind == "none" else Answers.cached(weights)
    settings = course.root / SETTINGS_FILE
    produced = provenance(
        [s.slug for s in chosen],
        settings.read_bytes() if settings.is_file() else None,
        weights.sha256,
        test_seed_source(seed),
        seed,
    )
    return Session(
        course,
        chosen,
        every,
        weights,
        outputs=outputs,
        answers=answers,
        policy=policy,
        sandbox=sandbox,
        seed=seed,
        provenance=produced,
        speed=speed,
    )


def course_stages(timeout: float | None = None, seed: int | None = None) -> list[Stage]:
    """Every stage in course order, with `timeout` for each call and the hidden cases `seed`
    draws (the cases a run and the pytest plugin's collection both name)."""
    every = load_stages()
    if timeout is not None:
        every = [replace(s, timeout=timeout) for s in every]
    if seed is not None:
        every = [with_hidden_cases(s, seed) for s in every]
    return every


def filtered(stages: list[Stage], wanted: tuple[str, ...], named: bool) -> list[Stage]:
    """The stages `--case` selects cases in. A stage named with --stage where it selects none
    is a usage error (a run of nothing must never pass); with no --stage, stages it selects
    nothing in are left out, and selecting nothing anywhere is the same error."""
    kept = [s for s in stages if any(selected(c, wanted) for c in s.cases)]
    empty = [s for s in stages if s not in kept]
    if (named and empty) or not kept:
        where = empty[0] if named else stages[0]
        names = "; ".join(f"'{c.name}'" for c in where.cases)
        scope = f"in {where.slug}" if named or len(stages) == 1 else "in any stage"
        raise StageError(
            f"--case {' '.join(repr(w) for w in wanted)} selects no case {scope}. "
            f"The cases of {where.slug} are: {names}"
        )
    return kept


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


def run(
    session: Session,
    stages: list[Stage] | None = None,
    cancel: threading.Event | None = None,
    trigger: str = "",
    listener: Listener = ignore,
) -> RunResult:
    """Grade (the session's renderer and `listener` both hear every event), then write every
    requested output and record progress. A cancelled run writes nothing."""
    from theinference.grading.progress import record_progress

    draw = session.renderer(trigger, cancel) if session.renderer else ignore

    def tell(event: Event) -> None:
        draw(event)
        listener(event)

    try:
        result = grade(
            session.course.root,
            stages or session.stages,
            session.weights,
            session.limits,
            session.answers,
            cancel,
            languages.localizing(tell, session.course.language),  # decodeStep in TypeScript
            session.policy,
            session.sandbox,
            session.seed,
        )
    finally:
        getattr(draw, "close", lambda: None)()  # a live status line must not outlive its run
        if session.sandbox is not None and session.sandbox.kind == "none":
            rotate_answer_secret()
    result = languages.localize_result(result, session.course.language)
    if result.cancelled:
        return result
    result.provenance = with_run(session.provenance, result.sandbox)
    if session.speed:
        result.speed = speed_after(result, session.stages, session.course.root, session.weights,
                                   session.limits, session.sandbox, cancel)
    if session.writer is not None:
        session.writer(result)
    record_progress(session.course.root, result)
    return result


def rotate_answer_secret() -> None:
    """After a run whose student process ran as the grader's own user: a new secret, so that
    nothing it could have signed is believed by a later run (best effort)."""
    from theinference.grading.answer_cache import rotate_secret
    from theinference.oracle.weights import cache_dir

    try:
        rotate_secret(cache_dir())
    except OSError:
        pass


def exit_code(result: RunResult) -> int:
    return exits.OK if result.passed else exits.NOT_PASSED


def run_once(session: Session) -> int:
    return exit_code(run(session))
