from pathlib import Path
from typing import Annotated

import typer

from theinference.commands.options import CourseDir


def stages(course_dir: CourseDir = Path(".")) -> None:
    """List the stages in course order, with your last result for each (in a course)."""
    from theinference.curriculum.stages import load_stages
    from theinference.grading.progress import read_progress
    from theinference.output.report import console
    from theinference.output.tables import print_stages

    root = course_dir.expanduser().resolve()
    progress = read_progress(root)
    rows = [
        (
            s.slug,
            s.title,
            ", ".join(s.requires) or "-",
            progress.get(s.slug, {}).get("status", "not run"),
        )
        for s in load_stages()
    ]
    print_stages(console(), rows, in_course=(root / "theinference.toml").is_file())


def hint(
    slug: Annotated[str, typer.Argument(help="A stage slug.")], course_dir: CourseDir = Path(".")
) -> None:
    """Show a stage's guidance from the course text and the classic bugs that concern it (in
    the course's language's names)."""
    from theinference.course.directory import course_language
    from theinference.curriculum.checks import CHECKS
    from theinference.curriculum.stages import load_stages, select
    from theinference.diagnosis.bugs import bugs_of

    (found,) = select(load_stages(), [slug])
    language = course_language(course_dir)
    checks = {name for name, check in CHECKS.items() if check.stage == found.slug}
    spoken = language.name  # the bugs' words are kept per language name
    bugs = [f"- {b.name(spoken)}: {b.hint(spoken)}" for b in bugs_of(checks)]
    listed = "\n\nThe bugs the grader can name here:\n" + "\n".join(bugs) if bugs else ""
    typer.echo(
        language.localize(
            f"{found.slug}: {found.title}\n\n{found.guidance}{listed}\n\n"
            f"check it while you work: theinference test --stage {found.slug} --watch",
        )
    )
