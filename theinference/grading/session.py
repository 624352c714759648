"""What `theinference test` does once: prepare, grade, write results.

The run itself never prints: whoever draws (the terminal, watch mode) listens to its events
and reads its result. Watch mode (watching.py) calls the same `run` for every rerun, so a watched
run and a single run can never disagree.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from theinference import exits
from theinference.course.directory import SETTINGS_FILE, Course, open_course
from theinference.curriculum.stages import Stage, StageError, load_stages, select, with_hidden_cases
from theinference.grading.answers import Answers
from theinference.grading.digests import SignedDigests, SignedRates
from theinference.grading.grader import RunPlan, grade
from theinference.grading.policy import EVERY_CASE, RunPolicy, selected
from theinference.grading.provenance import provenance, with_run
from theinference.grading.seed import NO_SEED, Seed
from theinference.grading.speed import speed_after
from theinference.oracle.weights import Weights, load_weights, print_nothing
from theinference.results import RunResult
from theinference.results.events import Event, Listener, ignore
from theinference.student.sandbox import choose
from theinference.student.setup import Limits, ProcessSetup

Renderer = Callable[[str, threading.Event | None], Listener]  # (trigger, cancel) -> drawing
Writer = Callable[[RunResult], None]  # writes a finished run's machine outputs


@dataclass(frozen=True)
class Output:
    format: str  # a name in formats.FORMATS
    path: Path | None  # None: stdout


@dataclass(frozen=True)
class LimitRequest:
    """Limits asked for on the command line; None: each stage spec's own (`[grading]` limits
    reach a run the same way, as options of the `theinference test` that `grade` starts)."""

    timeout: float | None = None
    memory_gb: float | None = None
    output_kb: int | None = None

    def applied(self, stage: Stage) -> Stage:
        asked = {"timeout": self.timeout,
                 "memory_bytes": None if self.memory_gb is None else int(self.memory_gb * 2**30),
                 "output_bytes": None if self.output_kb is None else int(self.output_kb * 1024)}
        return replace(stage, **{k: v for k, v in asked.items() if v is not None})


@dataclass(frozen=True)
class RunRequest:
    """What a command asks of a run, as given."""

    stages: tuple[str, ...] = ()  # slugs; none: every stage
    weights: str | None = None  # None: theinference.toml's
    seed: Seed = NO_SEED
    policy: RunPolicy = EVERY_CASE
    sandbox: str = "auto"
    limits: LimitRequest = LimitRequest()
    speed: bool = False  # also time the cached generation against the oracle's (speed.py)
    jobs: int | None = None  # processes for a stage's cases beside each other; None: what fits


@dataclass
class Session:
    course: Course
    stages: list[Stage]  # the selected ones, hidden cases included
    all_stages: list[Stage]  # for "run all" in watch mode
    weights: Weights
    setup: ProcessSetup  # how every student process of the session starts
    answers: Answers | None = None  # kept across watch reruns: answers stay in memory
    policy: RunPolicy = EVERY_CASE
    renderer: Renderer | None = None  # draws each run (the terminal); None: nothing drawn
    writer: Writer | None = None  # writes the requested outputs; None: nothing written
    seed: int | None = None  # --seed: hidden cases and the cache-use proofs' arguments
    fresh_seed: bool = False  # `seed` is not --seed's but drawn for one run (watching.py)
    provenance: dict = field(default_factory=dict)  # what produces the grade (provenance.py)
    speed: bool = False
    jobs: int = 1  # student processes taking a stage's cases beside each other (beside.py)


@dataclass(frozen=True)
class Presentation:
    """How a session's runs are shown and written: built by the output layer, called here."""

    writer: Callable[[Course], Writer] | None = None
    renderer: Callable[[Session], Renderer] | None = None
    notice: Callable[[str], None] = print_nothing  # told before a wait (weights being made)


def prepare(course_dir: Path, request: RunRequest,
            present: Presentation = Presentation()) -> Session:
    """Everything a run needs, checked up front and complete: course, stages, case filter,
    sandbox, weights, limits, and how its runs are shown and written."""
    course = open_course(course_dir)
    every = course_stages(request.limits, request.seed.value)
    chosen = select(every, list(request.stages))
    if request.policy.cases:
        chosen = filtered(chosen, request.policy.cases, named=bool(request.stages))
    sandbox = choose(request.sandbox)
    weights = load_weights(request.weights or course.weights, course.root, present.notice,
                           digest_memo(sandbox))
    sandbox.notes.extend(weights.notes)
    # as the grader's own user, the student's process could read the cache's secret: answers
    # then stay in memory, and the secret is replaced after each run (see `run`)
    answers = Answers.in_memory(weights) if sandbox.traits.own_user else Answers.cached(weights)
    settings = course.root / SETTINGS_FILE
    produced = provenance([s.slug for s in chosen],
                          settings.read_bytes() if settings.is_file() else None,
                          weights.sha256, request.seed)
    setup = ProcessSetup(course.root, weights.path, sandbox=sandbox, language=course.language,
                         rates=rate_memo(sandbox))
    session = Session(course, chosen, every, weights, setup, answers=answers,
                      policy=request.policy, seed=request.seed.value, provenance=produced,
                      speed=request.speed, jobs=request.jobs or jobs_that_fit(chosen))
    if present.writer is not None:
        session.writer = present.writer(course)
    if present.renderer is not None:
        session.renderer = present.renderer(session)
    return session


def digest_memo(sandbox) -> SignedDigests | None:
    """The weights' digests kept on disk, where the student's process cannot read the secret
    that signs them (as for the answer cache, below); none where it could."""
    from theinference.oracle.weights import cache_dir

    return None if sandbox.traits.own_user else SignedDigests(cache_dir())


def rate_memo(sandbox) -> SignedRates | None:
    """The machine's rate kept on disk across runs, where the digests are (above)."""
    from theinference.oracle.weights import cache_dir

    return None if sandbox.traits.own_user else SignedRates(cache_dir())


def jobs_that_fit(stages: list[Stage]) -> int:
    """As many student processes as the allocation has CPUs, and as fit in its memory beside
    this one grader, each at the largest memory cap of the stages graded."""
    from theinference.grading.allocation import GRADER_OVERHEAD_BYTES, read_allocation

    allocation = read_allocation()
    cap = max((s.memory_bytes or Limits().memory_bytes) for s in stages)
    return max(1, min(allocation.cpus, (allocation.memory_bytes - GRADER_OVERHEAD_BYTES) // cap))


def course_stages(limits: LimitRequest = LimitRequest(), seed: int | None = None) -> list[Stage]:
    """Every stage in course order, with the limits asked for and the hidden cases `seed`
    draws (the cases a run and the pytest plugin's collection both name)."""
    every = [limits.applied(s) for s in load_stages()]
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


def run(
    session: Session,
    stages: list[Stage] | None = None,
    cancel: threading.Event | None = None,
    trigger: str = "",
    listener: Listener = ignore,
) -> RunResult:
    """Grade (the session's renderer and `listener` both hear every event), then write every
    requested output and record progress. A cancelled run writes nothing."""
    from theinference.grading.progress import failed_stages, record_progress

    draw = session.renderer(trigger, cancel) if session.renderer else ignore
    setup = replace(session.setup, cancel=cancel or threading.Event())

    def tell(event: Event) -> None:
        draw(event)
        listener(event)

    try:
        plan = RunPlan(stages or session.stages, session.weights, session.answers,
                       session.policy, session.seed, session.jobs,
                       failed_stages(session.course.root), session.fresh_seed)
        localized = session.course.language.localizing(tell)  # decodeStep in TypeScript
        result = grade(setup, plan, localized)
    finally:
        getattr(draw, "close", lambda: None)()  # a live status line must not outlive its run
        if setup.sandbox is not None and setup.sandbox.traits.own_user:
            rotate_answer_secret()
    result = session.course.language.localize_result(result)
    if result.cancelled:
        return result
    result.provenance = with_run(session.provenance, result.sandbox)
    if session.speed:
        result.speed = speed_after(result, session.stages, setup, session.weights)
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
