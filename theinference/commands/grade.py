"""The instructor's commands, registered in cli.py: grade (gradebooks.py, gradescope.py and
report.py hold the rest). Each gathers plain data, hands it to the classroom modules, and
prints through output/class_screens.py; errors the instructor can fix are one line and an exit
code (exits.py)."""

from pathlib import Path
from typing import Annotated

import typer

from theinference import exits
from theinference.commands import limits

CourseOpt = Annotated[
    Path | None,
    typer.Option("--course-dir", "-C",
                  help="The instructor's course: its theinference.toml [grading] applies."),
]
StageOpt = Annotated[
    list[str] | None,
    typer.Option("--stage", "-s", help="A stage slug; repeat (default: [grading] stages, all)."),
]


def fail(message: str, code: int) -> exits.Abort:
    """The error to raise: `handled` (options.py) prints it and exits with its code."""
    return exits.Abort(message, code)


def instructor_settings(course_dir: Path | None, name: str = ""):
    """The course settings and the raw theinference.toml to lay over every submission."""
    from theinference.course.directory import SETTINGS_FILE, CourseError, course_settings
    from theinference.course.settings import Settings

    if course_dir is None:
        return Settings(), None
    path = course_dir.expanduser() / (name or SETTINGS_FILE)
    if not path.is_file():
        raise fail(f"{path} does not exist", exits.COURSE)
    try:
        return course_settings(path), path.read_bytes()
    except CourseError as exc:
        raise fail(str(exc), exits.COURSE) from None


def grading_sandbox(minimum: str | None):
    """The sandbox every submission will be graded in: the strongest this machine has,
    refused (exit 2) when that is below [grading] sandbox, or when a submission's code could
    write the grader's installation there (student/reach.py): it could change the grader of
    every submission after it."""
    from theinference.student.reach import why, writable_install
    from theinference.student.sandbox import SandboxError, choose

    try:
        chosen = choose(minimum or "auto")
    except SandboxError as exc:
        raise fail(f"refusing to grade below [grading] sandbox = {minimum!r}: {exc}",
                   exits.USAGE) from None
    if reachable := writable_install(chosen.kind):
        raise fail(f"refusing to grade a class in sandbox {chosen.kind}: {why(reachable)}, and "
                   "in the grader of every submission after it; install bubblewrap, or grade "
                   "as root from an installation only root can write", exits.USAGE)
    return chosen


def stage_points(settings, slugs: list[str]) -> dict[str, float]:
    """slug -> max score for the stages graded, in course order; unknown names refused."""
    from theinference.course.settings import SettingsError, check_stage_names
    from theinference.curriculum.stages import StageError, load_stages, select

    every = load_stages()
    try:
        check_stage_names(settings.grading, [s.slug for s in every])
        chosen = select(every, slugs or list(settings.grading.stages))
    except (StageError, SettingsError) as exc:
        raise fail(str(exc), exits.USAGE) from None
    return {s.slug: settings.grading.points(s.slug, s.score) for s in chosen}


def plan_seed(option: int | None, setting):
    """--seed, else [grading] seed: resolved once, with its source (grading/seed.py)."""
    from theinference.grading.seed import SeedError, resolve_seed

    try:
        return resolve_seed(option, setting)
    except SeedError as exc:
        raise fail(str(exc), exits.USAGE) from None


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise fail(f"--shard takes I/N (e.g. 2/4), not {text!r}", exits.USAGE) from None
    if not 1 <= index <= count:
        raise fail(f"--shard {text}: I must be between 1 and N", exits.USAGE)
    return index, count


def grade(
    submissions: Annotated[Path, typer.Argument(help="A folder: one entry per student.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The results folder.")],
    jobs: Annotated[
        int | None, typer.Option(help="At once (default: what fits).", callback=limits.at_least_one)
    ] = None,
    shard: Annotated[str | None, typer.Option(help="Grade slice I of N only, e.g. 1/4.")] = None,
    course_dir: CourseOpt = None,
    stage: StageOpt = None,
    case: Annotated[list[str] | None, typer.Option(help="Only cases naming this.")] = None,
    weights: Annotated[
        str | None, typer.Option(help="Default: the weights the course's theinference.toml names.")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Hidden cases' seed (wins over [grading]).", callback=limits.seed),
    ] = None,
    submission_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a whole submission may take (a backstop).", callback=limits.positive
        ),
    ] = 1800.0,
    cpus: Annotated[
        int | None,
        typer.Option(help="CPUs allocated to this run (a scheduler's figure), when fewer than "
                          "its affinity and cgroup show.", envvar="THEINFERENCE_CPUS",
                     callback=limits.at_least_one),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(help="Memory allocated to this run, e.g. 10G or bytes (K, M, G: powers "
                          "of 1024), when less than its cgroup and the machine show.",
                     envvar="THEINFERENCE_MEMORY", callback=limits.size),
    ] = None,
) -> None:
    """Grade a folder of submissions (course folders, .zip/.tar.gz, loose files) into RESULTS:
    one JSON per student and gradebook.csv. Unchanged submissions are not regraded. Sized to
    the CPUs and memory this process may use (affinity, cgroup, --cpus, --memory)."""
    from theinference.classroom.batch import Plan, grade_class, in_shard
    from theinference.classroom.gradebook import write_gradebook
    from theinference.classroom.intake import IntakeError, discover
    from theinference.classroom.records import SUBMISSIONS_DIR
    from theinference.grading.allocation import parse_size, read_allocation
    from theinference.output.class_screens import grading_progress, print_class_summary
    from theinference.output.report import print_error

    slice_ = parse_shard(shard)
    settings, toml = instructor_settings(course_dir)
    spec = weights or settings.weights
    plan = Plan(
        weights=spec,
        points=stage_points(settings, stage or []),
        grading=settings.grading,
        seed=plan_seed(seed, settings.grading.seed),
        cases=tuple(case or ()),
        memory_bytes=int((settings.grading.memory_gb or 8) * 2**30),
        settings_toml=toml,
        submission_timeout=submission_timeout,
        weights_sha256=warm_weights(spec, course_dir).sha256,
    )
    chosen = grading_sandbox(settings.grading.sandbox)
    typer.echo(f"sandbox: {chosen.kind}" + "".join(f"; {n}" for n in chosen.notes), err=True)
    try:
        found, skipped = discover(submissions)
    except (IntakeError, OSError) as exc:
        raise fail(f"cannot read {submissions}: {exc}", exits.USAGE) from None
    for name in skipped:
        print_error(f"skipped {name}: not a folder, .zip or .tar.gz")
    if not found:
        raise fail(f"{submissions} holds no submission (folders, .zip or .tar.gz)", exits.USAGE)
    chosen = [s for s in found if in_shard(s.id, slice_)]
    allocation = read_allocation(cpus, parse_size(memory) if memory else None)
    jobs = jobs_within(allocation, plan.memory_bytes, jobs)
    # a shard that draws no student is still a results folder `gradebook merge` accepts
    (out / SUBMISSIONS_DIR).mkdir(parents=True, exist_ok=True)
    with grading_progress(len(chosen)) as on_done:
        reused = []
        records = grade_class(chosen, plan, out, jobs,
                             lambda r, again: (reused.append(again), on_done(r, again)),
                             allocation)
    path = write_gradebook(out, records)
    print_class_summary(records, sum(reused), str(path))
    finished = all(r["status"] != "grader-error" for r in records)
    raise typer.Exit(exits.OK if finished else exits.UNFINISHED)


def jobs_within(allocation, memory_bytes: int, asked: int | None) -> int:
    """The submissions graded at once: as asked, never more than the allocation holds; said
    on stderr with the BLAS threads each gets."""
    from theinference.classroom.batch import blas_threads
    from theinference.grading.allocation import default_jobs
    from theinference.output.report import print_error

    allowed = default_jobs(memory_bytes, allocation)
    if asked is not None and asked > allowed:
        print_error(f"--jobs {asked} would oversubscribe this allocation "
                    f"({allocation.text()}): using {allowed}")
    jobs = min(asked or allowed, allowed)
    threads = blas_threads(allocation, jobs)
    typer.echo(f"allocation: {allocation.text()}; {jobs} at once, {threads} BLAS "
               f"thread{'s' if threads != 1 else ''} each", err=True)
    return jobs


def warm_weights(spec: str, course_dir: Path | None):
    """Make or check the weights once, before any submission waits on them."""
    from theinference.oracle.weights import WeightsError, load_weights
    from theinference.output.report import print_notice

    try:
        return load_weights(spec, (course_dir or Path.cwd()).expanduser().resolve(), print_notice)
    except WeightsError as exc:
        raise fail(str(exc), exits.WEIGHTS) from None
