"""Options several commands share, and how every command group is made."""

from pathlib import Path
from typing import Annotated

import typer


def command_group(help: str, **settings) -> typer.Typer:
    """A group of commands whose help is shown as written: rich markup is off, so a
    "[grading]" in an option's help stays in it instead of being read as a style."""
    return typer.Typer(help=help, rich_markup_mode=None, no_args_is_help=True, **settings)

CourseDir = Annotated[
    Path, typer.Option("--course-dir", "-C", help="The course directory (default: here).")
]
WeightsOpt = Annotated[
    str | None,
    typer.Option(
        "--weights",
        help="synthetic | gpt2 | path/to/model.safetensors "
        "(default: theinference.toml's weights, else synthetic).",
    ),
]
StageOpt = Annotated[
    list[str] | None,
    typer.Option("--stage", "-s", help="A stage slug; repeat for several (default: all)."),
]
