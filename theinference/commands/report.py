"""`theinference report`, `workflow matrix` and `summary`: the class report and GitHub
Actions workflows (class_report.py, workflow.py)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from theinference import exits
from theinference.commands.grade import fail
from theinference.commands.options import command_group

if TYPE_CHECKING:  # read only when a report is asked for
    from theinference.results.submission import Record


def report(
    results: Annotated[Path, typer.Argument(help="A results folder from grade or merge.")],
    html: Annotated[Path, typer.Option("--html", help="The page to write.")] = Path("class.html"),
    since: Annotated[
        Path | None, typer.Option(help="An earlier results folder: add what changed since.")
    ] = None,
    similarity: Annotated[
        bool, typer.Option(help="Compare the students' own code (template subtracted).")
    ] = True,
    threshold: Annotated[
        float, typer.Option(help="Similarity at which a pair is listed (0..1).")
    ] = 0.5,
) -> None:
    """The class report: one static page, and a page per student.

    Pass rate and common bugs per stage, error and run-time distributions, the speed ranking,
    similar code (template subtracted) and changes since an earlier run."""
    from theinference.classroom.class_report import write_report
    from theinference.classroom.records import read_records

    records = read_records(results)
    if not records:
        raise fail(f"{results} holds no graded submissions (run theinference grade)", exits.USAGE)
    if not 0 < threshold <= 1:
        raise fail(f"--threshold must lie in (0, 1], not {threshold}", exits.USAGE)
    sections = report_sections(records, since, threshold if similarity else None)
    written = write_report(records, html, sections)
    typer.echo(f"{html} ({len(records)} students; {len(written) - 1} student pages)")


def report_sections(records: "list[Record]", since: Path | None, threshold: float | None):
    """Speed, similarity (unless threshold is None), changes since an earlier run, and what
    the grading jobs had."""
    from theinference.classroom import report_sections as sections
    from theinference.classroom.records import read_records
    from theinference.classroom.regrade import diff_records
    from theinference.classroom.similarity import SimilarityUnavailable, similar_pairs
    from theinference.output.report import print_error

    out = [sections.speed_section(records)]
    if threshold is not None:
        try:
            out.append(sections.similarity_section(similar_pairs(records, threshold), threshold))
        except SimilarityUnavailable as exc:
            print_error(f"similar code not checked: {exc}")
    if since is not None:
        earlier = read_records(since)
        if not earlier:
            raise fail(f"{since} holds no graded submissions", exits.USAGE)
        out.append(sections.changes_section(diff_records(earlier, records), str(since)))
    out.append(sections.allocation_section(records))
    return tuple(s for s in out if s)


workflow_app = command_group("Grading a class in parallel: GitHub Actions, Slurm, Kubernetes.")
Shards = Annotated[int, typer.Option(help="Parallel jobs (shards).")]
Submissions = Annotated[str, typer.Option(help="The submissions folder.")]
CourseFolder = Annotated[str, typer.Option(help="The folder with theinference.toml.")]
Out = Annotated[Path | None, typer.Option("--out", "-o", help="Default: stdout.")]


# a generated file holds paths and options, no secret: readable by the group and others, as a
# file made under the usual umask 022 is, so fellow instructors sharing the class folder can
# read and resubmit it (the scheduler reads it as whoever submits; nothing executes it bare)
WRITTEN_MODE = 0o644


def emit(text: str, out: Path | None) -> None:
    from theinference.atomic import atomic_write

    if out is None:
        typer.echo(text, nl=False)
    else:
        atomic_write(out, text, mode=WRITTEN_MODE)
        typer.echo(f"wrote {out}", err=True)


def check_shards(shards: int) -> None:
    if shards < 1:
        raise fail("--shards must be at least 1", exits.USAGE)


@workflow_app.command("matrix")
def matrix(shards: Shards = 4, submissions: Submissions = "submissions",
           course: CourseFolder = "course", out: Out = None) -> None:
    """A GitHub Actions workflow: a matrix of `grade --shard I/N` jobs, then a merge."""
    from theinference.classroom.workflow import matrix_workflow

    check_shards(shards)
    emit(matrix_workflow(shards, submissions, course), out)


StagesOpt = Annotated[
    list[str] | None, typer.Option("--stage", "-s", help="A stage slug to grade; repeat "
                                   "(default: the course's [grading] stages).")]
SeedOpt = Annotated[int | None, typer.Option(help="Hidden cases' seed (default: the course's).")]
ResultsOpt = Annotated[str, typer.Option(help="The merged results folder.")]


def class_job(stages: list[str] | None, **options):
    """The options every task is told, checked before a file is written."""
    from theinference.classroom.clusters import ClassJob, JobError

    given = {k: v for k, v in options.items() if v is not None}
    try:
        return ClassJob(stages=tuple(stages or ()), **given)
    except JobError as exc:
        raise fail(str(exc), exits.USAGE) from None


@workflow_app.command("slurm")
def slurm(
    shards: Shards = 4, submissions: Submissions = "submissions",
    course: CourseFolder = "course", out: Out = None, stage: StagesOpt = None,
    seed: SeedOpt = None, results: ResultsOpt = "class-results",
    time: Annotated[str, typer.Option(help="Each task's time limit (#SBATCH --time).")]
    = "12:00:00",
    account: Annotated[str | None, typer.Option(help="#SBATCH --account (default: none).")]
    = None,
    partition: Annotated[str | None, typer.Option(help="#SBATCH --partition (default: none).")]
    = None,
    logs: Annotated[str, typer.Option(help="The jobs' log folder (and their ids: LOGS/jobs).")]
    = "logs",
    python: Annotated[str | None, typer.Option(
        help="The Python with theinference on the compute nodes (default: this one).")] = None,
) -> None:
    """A Slurm script: an array job of `grade --shard I/N` tasks, then a merge job.

    `bash FILE` submits both (and cancels the last submission's jobs still queued); task I
    takes its shard from SLURM_ARRAY_TASK_ID; the merge runs once every task has ended."""
    from theinference.classroom.slurm import slurm_script

    job = class_job(shards=shards, submissions=submissions, course=course, results=results,
                    stages=stage, seed=seed, time=time, account=account, partition=partition,
                    logs=logs, python=python)
    emit(slurm_script(job, out.name if out else "grade-class.slurm"), out)


@workflow_app.command("kubernetes")
def kubernetes(
    shards: Shards = 4,
    submissions: Submissions = "submissions",
    course: CourseFolder = "course",
    out: Out = None,
    claim: Annotated[str, typer.Option(help="The volume claim holding both folders.")]
    = "theinference-class",
    image: Annotated[str, typer.Option(help="The pods' image (Python 3.11 or later).")]
    = "python:3.11-slim",
    stage: StagesOpt = None, seed: SeedOpt = None, results: ResultsOpt = "class-results",
) -> None:
    """Kubernetes Jobs: an Indexed Job of `grade --shard I/N` pods, then a merge Job.

    The pod with JOB_COMPLETION_INDEX K grades shard K+1; apply -l step=grade, wait until it
    has ended (complete or failed), then apply -l step=merge."""
    from theinference.classroom.clusters import kubernetes_jobs

    job = class_job(shards=shards, submissions=submissions, course=course, results=results,
                    stages=stage, seed=seed)
    name = out.name if out else "grade-class.yaml"
    emit(kubernetes_jobs(job, name, claim, image), out)


def summary(
    results: Annotated[Path, typer.Argument(help="A `theinference test --json` file.")],
) -> None:
    """The stage table in markdown (for a CI job summary)."""
    from theinference.classroom.workflow import stage_table_markdown
    from theinference.results.json_form import read_run

    try:  # a ResultsError (not the grader's results) is a ValueError too
        run = read_run(results.read_bytes())
    except (OSError, ValueError) as exc:
        raise fail(f"cannot read {results}: {exc}", exits.USAGE) from None
    typer.echo(stage_table_markdown(run), nl=False)


def add_ci(directory: Path, ci: str) -> Path:
    """`init --ci github`: the student's workflow, beside the course."""
    from theinference.atomic import atomic_write
    from theinference.classroom.workflow import STUDENT_WORKFLOW_PATH, student_workflow

    if ci != "github":
        raise fail(f"--ci knows only 'github', not {ci!r}", exits.USAGE)
    path = directory / STUDENT_WORKFLOW_PATH
    if path.exists():
        raise fail(f"{path} exists: not overwriting it", exits.COURSE)
    atomic_write(path, student_workflow())
    return path
