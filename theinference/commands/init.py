from pathlib import Path
from typing import Annotated

import typer


def init(directory: Annotated[Path, typer.Argument(help="Where to create the course.")]) -> None:
    """Create a course directory: provided src/gpt2.py, stubs in src/kvcache.py, the adapters."""
    from theinference.course import CourseError, init_course
    from theinference.stages import load_stages

    try:
        files = init_course(directory)
    except OSError as exc:
        raise CourseError(f"cannot create {directory}: {exc.strerror}") from None
    first = load_stages()[0].slug
    typer.echo(
        f"Created {directory} ({len(files)} files). Next:\n"
        f"  cd {directory}\n  theinference test --stage {first} --watch"
    )
