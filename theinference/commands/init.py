from pathlib import Path
from typing import Annotated

import typer

from theinference.course.languages import ALL, Language


def said(language: Language) -> str:
    """python, or ts (TypeScript): a language as --lang takes it, and its title where that is
    another word (the help lists every language, so a new one needs no word here)."""
    other = language.title.lower() != language.name
    return f"{language.name} ({language.title})" if other else language.name


def init(
    directory: Annotated[Path, typer.Argument(help="Where to create the course.")],
    lang: Annotated[str, typer.Option("--lang", help=" | ".join(map(said, ALL)) + ".")] = "python",
    ci: Annotated[
        str | None, typer.Option("--ci", help="Also add a CI workflow: github (grades on push).")
    ] = None,
    notebook: Annotated[
        bool,
        typer.Option("--notebook", help="Write the course as one notebook (Jupyter, Colab)."),
    ] = False,
) -> None:
    """Create a course directory: provided src/gpt2.py, stubs in src/kvcache.py, the adapters."""
    if notebook:
        return init_notebook(directory, lang)
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


def init_notebook(directory: Path, lang: str) -> None:
    """DIR/kvcache.ipynb: the stages in order, a check cell after each (notebook/course.py)."""
    from theinference.course import languages
    from theinference.course.directory import CourseError
    from theinference.exits import Abort
    from theinference.notebook.course import NOTEBOOK_NAME, notebook_json

    if not languages.by_name(lang).notebook:
        raise Abort("--notebook writes a Python notebook: it cannot be used with --lang " + lang)
    path = directory / NOTEBOOK_NAME
    if path.exists():
        raise CourseError(f"{path} already exists: not overwriting a student's notebook")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(notebook_json())
    except OSError as exc:
        raise CourseError(f"cannot create {path}: {exc.strerror}") from None
    typer.echo(
        f"Created {path}. Open it in Jupyter, VS Code or Colab (a kernel with theinference "
        "installed: pip install 'theinference[notebook]'), run its cells in order; each "
        "stage's check cell grades it."
    )
