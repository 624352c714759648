"""`theinference test`: grade the course directory, once or on every save."""

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from theinference.commands import limits
from theinference.commands.options import CourseDir, StageOpt, WeightsOpt
from theinference.exits import Abort
from theinference.output.formats import FORMATS

TERMINAL = "terminal"
FormatName = StrEnum("FormatName", {name: name for name in (TERMINAL, *FORMATS)})
DEFAULT_FORMAT = FormatName(TERMINAL)


def test(
    stage: StageOpt = None,
    course_dir: CourseDir = Path("."),
    weights: WeightsOpt = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Regrade on every save.")] = False,
    poll: Annotated[
        bool, typer.Option("--poll", help="Watch by polling (WSL, NFS, network drives).")
    ] = False,
    no_clear: Annotated[
        bool, typer.Option("--no-clear", help="Watch: keep each run in the scrollback.")
    ] = False,
    fmt: Annotated[
        FormatName, typer.Option("--format", help="What to write to --output.")
    ] = DEFAULT_FORMAT,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File for --format (default: stdout).")
    ] = None,
    case: Annotated[
        list[str] | None,
        typer.Option("--case", help="Only cases whose name contains this; repeat for several."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Leave out the long cases while iterating (not with files)."),
    ] = False,
    all_cases: Annotated[
        bool,
        typer.Option("--all-cases", help="Watch mode: every case, not up to the first failure."),
    ] = False,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Add hidden random cases drawn with this seed (graders; else THEINFERENCE_SEED).",
            callback=limits.seed,
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Student processes taking a stage's cases at once (default: as many as "
            "the allocation's CPUs and memory allow).",
            callback=limits.at_least_one,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds per adapter call (default: each stage's).", callback=limits.positive
        ),
    ] = None,
    memory_gb: Annotated[
        float | None,
        typer.Option(
            help="Heap limit of the student's process, GiB (default: each stage's, 8).",
            callback=limits.gibibytes,
        ),
    ] = None,
    output_kb: Annotated[
        int | None,
        typer.Option(
            help="Output kept per call and stream, KiB (default: each stage's, 64).",
            callback=limits.kibibytes,
        ),
    ] = None,
    sandbox: Annotated[
        str,
        typer.Option(
            help="auto | bwrap | unprivileged-user | none: how to isolate the student's "
            "process (auto: the strongest this machine has; bwrap, unprivileged-user: refuse "
            "to grade with less; none: no bubblewrap)."
        ),
    ] = "auto",
    speed: Annotated[
        bool,
        typer.Option(
            "--speed",
            help="After the generate loop passes, time your cached generation against the "
            "oracle's (a ratio; in the report and JSON).",
        ),
    ] = False,
    files: dict[str, Path] | None = None,  # --json FILE etc., from formats.FORMATS
) -> None:
    """Grade the course directory's stages against the recompute oracle."""
    from theinference.grading.session import LimitRequest, Presentation, RunRequest, prepare
    from theinference.output import formats, terminal
    from theinference.output.report import print_notice

    outputs = outputs_for(fmt.value, output, files or {})
    policy = policy_for(watch, quick, all_cases, case or [], written=[o.format for o in outputs])
    if speed and watch:
        raise Abort("--speed times a finished run: it cannot be used with --watch")
    request = RunRequest(
        stages=tuple(stage or ()), weights=weights, seed=seed_of(seed), policy=policy,
        sandbox=sandbox, limits=LimitRequest(timeout, memory_gb, output_kb),
        speed=speed, jobs=jobs,
    )
    present = Presentation(
        writer=lambda course: formats.writer(outputs, course.grading),
        renderer=terminal.session_renderer if fmt.value == TERMINAL else None,
        notice=print_notice,
    )
    session = prepare(course_dir, request, present)
    if speed:
        raise typer.Exit(graded_with_speed(session, terminal_shown=fmt.value == TERMINAL))
    raise typer.Exit(grade_session(session, watch, poll, clear=not no_clear))


def graded_with_speed(session, terminal_shown: bool) -> int:
    """One run, then its speed figure (measured after the run) under the report."""
    from theinference.grading.session import exit_code, run
    from theinference.output.report import console
    from theinference.output.tables import print_speed

    result = run(session)
    if terminal_shown and result.speed is not None:
        print_speed(console(), result.speed)
    return exit_code(result)


def outputs_for(fmt: str, output: Path | None, files: dict[str, Path]) -> list:
    """The machine outputs asked for: --format to --output (or stdout), then each --NAME FILE."""
    from theinference.grading.session import Output

    if fmt == TERMINAL and output is not None:
        raise Abort("--output needs a --format other than terminal")
    outputs = [] if fmt == TERMINAL else [Output(fmt, output)]
    return outputs + [Output(name, path) for name, path in files.items()]


def policy_for(watch: bool, quick: bool, all_cases: bool, cases: list[str], written: list[str]):
    """Watch mode stops each stage at its first failing case; a run that writes results
    (`written`: their formats) always runs every case (a CI result must not depend on the
    order), so --quick is refused with them."""
    from theinference.grading.policy import RunPolicy

    if quick and written:
        raise Abort(f"--quick leaves cases out: it cannot be used when writing {written[0]} "
                    "results, which hold every case")
    return RunPolicy(
        stop_at_first_failure=watch and not all_cases and not written,
        quick=quick,
        cases=tuple(cases),
    )


def grade_session(session, watch: bool, poll: bool, clear: bool = True) -> int:
    from theinference.grading.session import run_once

    if not watch:
        return run_once(session)
    from theinference.grading.watching import WatchLoop
    from theinference.output.watch import KeyReader, watch_view

    keys = KeyReader()
    return WatchLoop(session, watch_view(session, keys.single_keys, clear), keys, poll).run()


def with_format_files(command):
    """The command with one `--NAME FILE` option per machine format in formats.FORMATS (e.g.
    --json r.json), handed to it as `files` ({name: path} of those given)."""
    import functools
    import inspect

    def option(name: str) -> inspect.Parameter:
        help_text = f"Also write {FORMATS[name].help} here."
        kind = Annotated[Path | None, typer.Option(f"--{name}", help=help_text)]
        return inspect.Parameter(
            f"{name}_file", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind
        )

    @functools.wraps(command)
    def with_files(**kwargs):
        given = {name: kwargs.pop(f"{name}_file") for name in FORMATS}
        files = {name: path for name, path in given.items() if path is not None}
        return command(**kwargs, files=files)

    own = [p for p in inspect.signature(command).parameters.values() if p.name != "files"]
    with_files.__signature__ = inspect.Signature([*own, *(option(n) for n in FORMATS)])
    return with_files


test = with_format_files(test)


def seed_of(option: int | None):
    """--seed, else THEINFERENCE_SEED: resolved once, with its source (grading/seed.py)."""
    from theinference.grading.seed import SeedError, resolve_seed

    try:
        return resolve_seed(option, "env")
    except SeedError as exc:
        raise Abort(str(exc)) from None
