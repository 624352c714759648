"""`theinference gradescope build | warm | run`: the Gradescope autograder (autograder.py)."""

from pathlib import Path
from typing import Annotated

import typer

from theinference import exits
from theinference.commands.grade import CourseOpt, fail
from theinference.commands.options import command_group

gradescope_app = command_group("A Gradescope autograder for the course.")


@gradescope_app.command("build")
def build(
    course_dir: CourseOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="The zip to upload.")] = Path(
        "autograder.zip"
    ),
) -> None:
    """Write the autograder zip: setup.sh, run_autograder, the course's theinference.toml and
    this theinference (setup.sh installs it and precomputes the oracle's answers)."""
    from theinference.classroom.autograder import build_bundle
    from theinference.classroom.class_run import instructor_settings, stage_points

    settings, toml = instructor_settings(course_dir)
    stage_points(settings, [])  # refuse unknown stages now, not on Gradescope
    names = build_bundle(toml, out)
    shown = [n for n in names if "/" not in n]
    typer.echo(f"{out}: {', '.join(shown)} and theinference ({len(names) - len(shown)} files)."
               "\nUpload it as the assignment's autograder (Gradescope: Configure Autograder).")


@gradescope_app.command("warm")
def warm(
    settings_file: Annotated[Path, typer.Option("--settings", help="The theinference.toml.")],
) -> None:
    """Make the weights and the oracle's answers for every public case (setup.sh runs this)."""
    from theinference.classroom.autograder import warm as warm_answers
    from theinference.classroom.class_run import instructor_settings, stage_points
    from theinference.oracle.weights import WeightsError

    settings, _ = instructor_settings(settings_file.parent, settings_file.name)
    try:
        count, seconds = warm_answers(settings, stage_points(settings, []))
    except WeightsError as exc:
        raise fail(str(exc), exits.WEIGHTS) from None
    typer.echo(f"{count} public cases' answers cached in {seconds:.1f} s")


@gradescope_app.command("run")
def run(
    root: Annotated[Path, typer.Option(help="Gradescope's root (run_autograder gives it).")] = Path(
        "/autograder"
    ),
) -> None:
    """Grade ROOT/submission with ROOT/source's settings; write ROOT/results/results.json."""
    from theinference.classroom.autograder import grade_submission, write_results
    from theinference.classroom.batch import Plan
    from theinference.classroom.class_run import instructor_settings, stage_points
    from theinference.output.gradescope import failure_results, gradescope_results
    from theinference.student.sandbox import SandboxError, choose

    settings, toml = instructor_settings(root / "source")
    try:
        choose(settings.grading.sandbox or "auto")
    except SandboxError as exc:  # the student still learns why nothing was graded
        message = f"The autograder refuses to grade below its sandbox setting: {exc}"
        write_results(root, failure_results(message))
        raise fail(message, exits.USAGE) from None
    plan = Plan(
        weights=settings.weights,
        points=stage_points(settings, []),
        grading=settings.grading,
        seed=autograder_seed(settings, root),
        memory_bytes=int((settings.grading.memory_gb or 8) * 2**30),
        settings_toml=toml,
    )
    graded = grade_submission(root, plan)
    if graded.results is None:
        data = failure_results(graded.failure)
    else:  # the same rendering as `theinference test --format gradescope`
        data = gradescope_results(graded.results, plan.points, plan.grading)
        data["extra_data"].update(graded.extra or {})
    path = write_results(root, data)
    total = sum(t["max_score"] for t in data["tests"])
    typer.echo(f"{path}: {data['score']:g} of {total:g} ({len(data['tests'])} tests)")


def autograder_seed(settings, root: Path):
    """[grading] seed as the autograder reads it: resolved once, with its source. A malformed
    THEINFERENCE_SEED grades with no hidden cases rather than refusing the student a grade;
    the provenance then says `none`."""
    from theinference.grading.seed import NO_SEED, SeedError, resolve_seed

    try:
        return resolve_seed(None, settings.grading.seed, submission_root=root)
    except SeedError:
        return NO_SEED
