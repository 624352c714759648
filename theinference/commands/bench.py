"""`theinference bench`: the student's cache against their own recompute."""

from pathlib import Path
from typing import Annotated

import typer

from theinference.commands import limits
from theinference.commands.options import CourseDir, WeightsOpt
from theinference.exits import Abort


def bench(
    course_dir: CourseDir = Path("."),
    weights: WeightsOpt = None,
    lengths: Annotated[
        str, typer.Option(help="Prompt lengths, comma-separated.")
    ] = "16,64,128,256,512",
    new_tokens: Annotated[
        int, typer.Option(help="Tokens generated per timing.", callback=limits.at_least_one)
    ] = 16,
    repeats: Annotated[
        int,
        typer.Option(
            help="Timed runs per figure (after a warm-up).", callback=limits.at_least_one
        ),
    ] = 3,
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Time your cached generation against recomputing, over growing prompt lengths."""
    import json

    from theinference.atomic import atomic_write
    from theinference.course.directory import open_course
    from theinference.grading.bench import BenchPlan, to_json
    from theinference.grading.bench import bench as run_bench
    from theinference.oracle.weights import load_weights
    from theinference.output.report import console
    from theinference.output.tables import print_bench
    from theinference.output.terminal import LiveStatus
    from theinference.student.setup import Limits, ProcessSetup

    sizes = prompt_lengths(lengths, new_tokens, repeats)
    status = LiveStatus(console(), "bench: loading the weights").start()
    try:
        course = open_course(course_dir)
        w = load_weights(weights or course.weights, course.root)
        if max(sizes) + new_tokens > w.config.n_ctx:
            raise Abort(
                f"a {max(sizes)}-token prompt plus {new_tokens} new tokens exceeds the "
                f"{w.config.n_ctx}-token context"
            )
        setup = ProcessSetup(course.root, w.path, Limits(timeout=300), language=course.language)
        result = run_bench(setup, w, BenchPlan(sizes, new_tokens, repeats), status.show)
    finally:
        status.stop()
    print_bench(console(), result)
    if json_file is not None:
        atomic_write(json_file, json.dumps(to_json(result), indent=2) + "\n")


def prompt_lengths(lengths: str, new_tokens: int, repeats: int) -> list[int]:
    try:
        sizes = [int(x) for x in lengths.split(",") if x.strip()]
    except ValueError:
        raise Abort(f"--lengths must be whole numbers, got '{lengths}'") from None
    if new_tokens < 2 or repeats < 1 or not sizes:
        raise Abort("need --new-tokens >= 2, --repeats >= 1 and a length")
    if min(sizes) < 1:
        raise Abort(f"--lengths must all be at least 1, got '{lengths}'")
    return sizes
