"""Options several commands share."""

from pathlib import Path
from typing import Annotated

import typer

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
