"""`theinference verify`, for course authors."""

from pathlib import Path
from typing import Annotated

import typer

from theinference import exits
from theinference.commands.options import StageOpt, WeightsOpt


def verify(
    solutions: Annotated[
        Path | None,
        typer.Option(
            help="Folder with reference_kvcache.py and bugs.toml "
            "(default: a source checkout's tests/solutions; the package ships none)."
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Leave out the long cases (over 300 tokens).")
    ] = False,
    bug: Annotated[
        list[str] | None, typer.Option("--bug", help="Only this bug id; repeat for several.")
    ] = None,
    stage: StageOpt = None,
    weights: WeightsOpt = None,
) -> None:
    """For course authors: the reference must pass, every planted bug must fail and be named."""
    from theinference.curriculum.stages import load_stages, select
    from theinference.grading.answers import Answers
    from theinference.grading.verify import Grounds, default_solutions_dir
    from theinference.grading.verify import verify as run_verify
    from theinference.oracle.weights import load_weights
    from theinference.output.report import console
    from theinference.output.tables import print_verify
    from theinference.output.terminal import verify_progress

    status, listener_for = verify_progress(console())
    try:
        w = load_weights(weights or "synthetic", Path.cwd())
        stages = select(load_stages(), stage or [])
        folder = solutions or default_solutions_dir()
        answers = Answers.cached(w)
        rows = run_verify(Grounds(w, answers, folder), stages, quick, bug or [], listener_for)
    finally:
        status.stop()
    print_verify(console(), rows, w.label)
    raise typer.Exit(exits.OK if all(r.ok for r in rows) else exits.NOT_PASSED)
