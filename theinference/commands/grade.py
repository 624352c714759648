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
    from theinference.classroom.batch import grade_class
    from theinference.classroom.class_run import ClassOptions, build
    from theinference.classroom.gradebook import write_gradebook
    from theinference.classroom.records import SUBMISSIONS_DIR
    from theinference.output.class_screens import grading_progress, print_class_summary
    from theinference.output.report import print_error, print_notice

    options = ClassOptions(submissions, out, jobs, shard, course_dir, tuple(stage or ()),
                           tuple(case or ()), weights, seed, submission_timeout, cpus, memory)
    run = build(options, print_notice)
    for is_error, line in run.said():
        if is_error:
            print_error(line)
        else:
            typer.echo(line, err=True)
    # a shard that draws no student is still a results folder `gradebook merge` accepts
    (out / SUBMISSIONS_DIR).mkdir(parents=True, exist_ok=True)
    with grading_progress(len(run.submissions)) as on_done:
        reused = []
        records = grade_class(list(run.submissions), run.plan, out, run.jobs,
                              lambda r, again: (reused.append(again), on_done(r, again)),
                              run.allocation)
    path = write_gradebook(out, records)
    print_class_summary(records, sum(reused), str(path))
    finished = all(r.status != "grader-error" for r in records)
    raise typer.Exit(exits.OK if finished else exits.UNFINISHED)
