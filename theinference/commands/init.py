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
    from theinference.course.languages import LANGUAGES, TYPESCRIPT
    from theinference.curriculum.stages import load_stages
    from theinference.exits import Abort

    if lang not in LANGUAGES:
        raise Abort(f"unknown language '{lang}': choose one of {', '.join(LANGUAGES)}")
    try:
        files = init_course(directory, lang)
    except OSError as exc:
        raise CourseError(f"cannot create {directory}: {exc.strerror}") from None
    if ci is not None:
        from theinference.commands.report import add_ci

        files.append(add_ci(directory, ci))
    first = load_stages()[0].slug
    install = (
        "  npm install   # once: the TypeScript runner (tsx) and compiler, pinned\n"
        if lang == TYPESCRIPT else ""
    )
    typer.echo(
        f"Created {directory} ({len(files)} files). Next:\n"
        f"  cd {directory}\n{install}  theinference test --stage {first} --watch"
    )
