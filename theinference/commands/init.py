from pathlib import Path
from typing import Annotated

import typer


def init(
    directory: Annotated[Path, typer.Argument(help="Where to create the course.")],
    lang: Annotated[str, typer.Option("--lang", help="python | ts (TypeScript).")] = "python",
    ci: Annotated[
        str | None, typer.Option("--ci", help="Also add a CI workflow: github (grades on push).")
    ] = None,
) -> None:
    """Create a course directory: provided src/gpt2.py, stubs in src/kvcache.py, the adapters."""
    from theinference.course.directory import CourseError, init_course
    from theinference.course.languages import LanguageError, by_name
    from theinference.curriculum.stages import load_stages
    from theinference.exits import Abort

    try:
        language = by_name(lang)
    except LanguageError as exc:
        raise Abort(str(exc)) from None
    try:
        files = init_course(directory, language)
    except OSError as exc:
        raise CourseError(f"cannot create {directory}: {exc.strerror}") from None
    if ci is not None:
        from theinference.commands.report import add_ci

        files.append(add_ci(directory, ci))
    first = load_stages()[0].slug
    typer.echo(
        f"Created {directory} ({len(files)} files). Next:\n"
        f"  cd {directory}\n{language.first_steps}  theinference test --stage {first} --watch"
    )
