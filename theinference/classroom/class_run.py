"""A class's grading decided whole before any submission is graded: the instructor's settings,
the plan every grade follows, the sandbox, the submissions of this shard, and how many are
graded at once. `theinference grade` builds one (build) and hands it to batch.grade_class;
every error an instructor can fix is an exits.Abort with its code, raised here, before any
work."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from theinference import exits
from theinference.classroom.batch import Plan, blas_threads, in_shard
from theinference.classroom.intake import IntakeError, Submission, discover
from theinference.course.settings import Settings
from theinference.grading.allocation import Allocation, default_jobs, parse_size, read_allocation
from theinference.student.sandbox import Sandbox

DEFAULT_MEMORY_GB = 8  # a submission's memory cap when [grading] memory_gb does not say


@dataclass(frozen=True)
class ClassOptions:
    """What the command line asked for, as given (None: not given)."""

    submissions: Path
    out: Path
    jobs: int | None = None
    shard: str | None = None  # "I/N"
    course_dir: Path | None = None
    stages: tuple[str, ...] = ()
    cases: tuple[str, ...] = ()
    weights: str | None = None
    seed: int | None = None
    submission_timeout: float = 1800.0
    cpus: int | None = None
    memory: str | None = None  # "10G" or bytes


@dataclass(frozen=True)
class ClassRun:
    """Everything a class's grading needs, complete: nothing is decided after it is built."""

    plan: Plan
    sandbox: Sandbox
    submissions: tuple[Submission, ...]  # this shard's
    skipped: tuple[str, ...]  # entries of the folder that are no submission
    allocation: Allocation
    jobs: int  # graded at once
    oversubscribed: int | None  # --jobs asked beyond the allocation, or None
    out: Path

    def said(self) -> list[tuple[bool, str]]:
        """What the run says on stderr before grading, in order: (is it an error, the line)."""
        notes = "".join(f"; {n}" for n in self.sandbox.notes)
        lines = [(False, f"sandbox: {self.sandbox.kind}{notes}")]
        lines += [(True, f"skipped {name}: not a folder, .zip or .tar.gz") for name in self.skipped]
        if self.oversubscribed is not None:
            lines.append((True, f"--jobs {self.oversubscribed} would oversubscribe this "
                                f"allocation ({self.allocation.text()}): using {self.jobs}"))
        threads = blas_threads(self.allocation, self.jobs)
        lines.append((False, f"allocation: {self.allocation.text()}; {self.jobs} at once, "
                             f"{threads} BLAS thread{'s' if threads != 1 else ''} each"))
        return lines


def build(options: ClassOptions, notice: Callable[[str], None]) -> ClassRun:
    """The class's run, or exits.Abort saying what to fix. `notice`: progress while the
    weights are made or checked."""
    slice_ = parse_shard(options.shard)
    settings, toml = instructor_settings(options.course_dir)
    spec = options.weights or settings.weights
    memory_gb = settings.grading.memory_gb or DEFAULT_MEMORY_GB
    chosen = grading_sandbox(settings.grading.sandbox)  # refused before any weights are made
    plan = Plan(
        weights=spec,
        points=stage_points(settings, list(options.stages)),
        grading=settings.grading,
        seed=plan_seed(options.seed, settings.grading.seed),
        cases=options.cases,
        memory_bytes=int(memory_gb * 2**30),
        settings_toml=toml,
        submission_timeout=options.submission_timeout,
        weights_sha256=warm_weights(spec, options.course_dir, notice, chosen).sha256,
    )
    found, skipped = submissions_in(options.submissions)
    allocation = read_allocation(options.cpus, parse_size(options.memory) if options.memory
                                 else None)
    allowed = default_jobs(plan.memory_bytes, allocation)
    asked = options.jobs
    return ClassRun(
        plan=plan,
        sandbox=chosen,
        submissions=tuple(s for s in found if in_shard(s.id, slice_)),
        skipped=tuple(skipped),
        allocation=allocation,
        jobs=min(asked or allowed, allowed),
        oversubscribed=asked if asked is not None and asked > allowed else None,
        out=options.out,
    )


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise exits.Abort(f"--shard takes I/N (e.g. 2/4), not {text!r}", exits.USAGE) from None
    if not 1 <= index <= count:
        raise exits.Abort(f"--shard {text}: I must be between 1 and N", exits.USAGE)
    return index, count


def submissions_in(folder: Path) -> tuple[list[Submission], list[str]]:
    """The folder's submissions and the entries that are none; refused when it holds none."""
    try:
        found, skipped = discover(folder)
    except (IntakeError, OSError) as exc:
        raise exits.Abort(f"cannot read {folder}: {exc}", exits.USAGE) from None
    if not found:
        raise exits.Abort(f"{folder} holds no submission (folders, .zip or .tar.gz)",
                          exits.USAGE)
    return found, skipped


def instructor_settings(course_dir: Path | None, name: str = "") -> tuple[Settings, bytes | None]:
    """The course settings and the raw theinference.toml to lay over every submission."""
    from theinference.course.directory import SETTINGS_FILE, CourseError, course_settings

    if course_dir is None:
        return Settings(), None
    path = course_dir.expanduser() / (name or SETTINGS_FILE)
    if not path.is_file():
        raise exits.Abort(f"{path} does not exist", exits.COURSE)
    try:
        return course_settings(path), path.read_bytes()
    except CourseError as exc:
        raise exits.Abort(str(exc), exits.COURSE) from None


def grading_sandbox(minimum: str | None) -> Sandbox:
    """The sandbox every submission will be graded in: the strongest this machine has,
    refused (exit 2) when that is below [grading] sandbox, or when a submission's code could
    write the grader's installation there (student/reach.py): it could change the grader of
    every submission after it."""
    from theinference.student.reach import why, writable_install
    from theinference.student.sandbox import SandboxError, choose

    try:
        chosen = choose(minimum or "auto")
    except SandboxError as exc:
        raise exits.Abort(f"refusing to grade below [grading] sandbox = {minimum!r}: {exc}",
                          exits.USAGE) from None
    if reachable := writable_install(chosen):
        raise exits.Abort(
            f"refusing to grade a class in sandbox {chosen.kind}: {why(reachable)}, and in the "
            "grader of every submission after it; install bubblewrap, or grade as root from an "
            "installation only root can write", exits.USAGE)
    return chosen


def stage_points(settings: Settings, slugs: list[str]) -> dict[str, float]:
    """slug -> max score for the stages graded, in course order; unknown names refused."""
    from theinference.course.settings import SettingsError, check_stage_names
    from theinference.curriculum.stages import StageError, load_stages, select

    every = load_stages()
    try:
        check_stage_names(settings.grading, [s.slug for s in every])
        chosen = select(every, slugs or list(settings.grading.stages))
    except (StageError, SettingsError) as exc:
        raise exits.Abort(str(exc), exits.USAGE) from None
    return {s.slug: settings.grading.points(s.slug, s.score) for s in chosen}


def plan_seed(option: int | None, setting):
    """--seed, else [grading] seed: resolved once, with its source (grading/seed.py)."""
    from theinference.grading.seed import SeedError, resolve_seed

    try:
        return resolve_seed(option, setting)
    except SeedError as exc:
        raise exits.Abort(str(exc), exits.USAGE) from None


def warm_weights(spec: str, course_dir: Path | None, notice: Callable[[str], None],
                 sandbox: Sandbox):
    """Make or check the weights once, before any submission waits on them: through the
    digests' memo every submission's run reads (where `sandbox` allows one), so a file the
    memo knows is not read and hashed again, and a file read here teaches it."""
    from theinference.grading.session import digest_memo
    from theinference.oracle.weights import WeightsError, load_weights

    folder = (course_dir or Path.cwd()).expanduser().resolve()
    try:
        return load_weights(spec, folder, notice, digest_memo(sandbox))
    except WeightsError as exc:
        raise exits.Abort(str(exc), exits.WEIGHTS) from None
