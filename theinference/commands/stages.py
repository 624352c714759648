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
    """Show a stage's guidance from the course text (in the course's language's names)."""
    from theinference.course.languages import course_language, localize
    from theinference.curriculum.stages import load_stages, select

    (found,) = select(load_stages(), [slug])
    language = course_language(course_dir.expanduser().resolve())
    typer.echo(
        localize(
            f"{found.slug}: {found.title}\n\n{found.guidance}\n\n"
            f"check it while you work: theinference test --stage {found.slug} --watch",
            language,
        )
    )
