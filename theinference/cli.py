"""The command line: each command gathers plain data and hands it to the output layer.

Heavy imports (NumPy, the oracle, rich) happen inside command bodies so `--help` is instant.
Errors the user can fix become one message on stderr and a distinct exit code (exits.py).
"""

from pathlib import Path
from typing import Annotated

import typer

from theinference import __version__, exits

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Grade a KV cache for GPT-2, stage by stage, against a NumPy recompute oracle.",
)

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


def fail(message: str, code: int) -> typer.Exit:
    from theinference.report import print_error

    print_error(message)
    return typer.Exit(code)


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Where to create the course.")],
    lang: Annotated[str, typer.Option("--lang", help="python | ts (TypeScript).")] = "python",
    ci: Annotated[
        str | None, typer.Option("--ci", help="Also add a CI workflow: github (grades on push).")
    ] = None,
) -> None:
    """Create a course directory: provided src/gpt2.py, stubs in src/kvcache.py, the adapters."""
    from theinference.course import CourseError, init_course
    from theinference.languages import LANGUAGES, TYPESCRIPT
    from theinference.stages import load_stages

    if lang not in LANGUAGES:
        raise fail(f"unknown language '{lang}': choose one of {', '.join(LANGUAGES)}", exits.USAGE)
    try:
        files = init_course(directory, lang)
    except CourseError as exc:
        raise fail(str(exc), exits.COURSE) from None
    except OSError as exc:
        raise fail(f"cannot create {directory}: {exc.strerror}", exits.COURSE) from None
    if ci is not None:
        files.append(class_report.add_ci(directory, ci))
    install = "  npm install   # once: the TypeScript runner (tsx)\n" if lang == TYPESCRIPT else ""
    first = load_stages()[0].slug
    typer.echo(
        f"Created {directory} ({len(files)} files). Next:\n"
        f"  cd {directory}\n{install}  theinference test --stage {first} --watch"
    )


FORMATS = ("terminal", "json", "junit", "gradescope")


@app.command()
def test(
    stage: StageOpt = None,
    course_dir: CourseDir = Path("."),
    weights: WeightsOpt = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Regrade on every save.")] = False,
    poll: Annotated[
        bool, typer.Option("--poll", help="Watch by polling (WSL, NFS, network drives).")
    ] = False,
    fmt: Annotated[
        str, typer.Option("--format", help="terminal | json | junit | gradescope, to --output.")
    ] = "terminal",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File for --format (default: stdout).")
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
    junit_file: Annotated[
        Path | None, typer.Option("--junit", help="Also write JUnit XML here.")
    ] = None,
    gradescope_file: Annotated[
        Path | None, typer.Option("--gradescope", help="Also write Gradescope results.json here.")
    ] = None,
    case: Annotated[
        list[str] | None,
        typer.Option("--case", help="Only cases whose name contains this; repeat for several."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            envvar="THEINFERENCE_SEED",
            help="Add hidden random cases drawn with this seed (graders).",
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds per adapter call (default: each stage's).")
    ] = None,
    memory_gb: Annotated[
        float | None,
        typer.Option(help="Heap limit of the student's process, GiB (default: each stage's, 8)."),
    ] = None,
    output_kb: Annotated[
        int | None,
        typer.Option(help="Output kept per call and stream, KiB (default: each stage's, 64)."),
    ] = None,
    sandbox: Annotated[
        str,
        typer.Option(
            help="auto | bwrap | none: isolate the student's process with bubblewrap "
            "(auto: when it works here; bwrap: refuse to grade without it)."
        ),
    ] = "auto",
) -> None:
    """Grade the course directory's stages against the recompute oracle."""
    from theinference.session import Output, override_limits, prepare, run_once

    if fmt not in FORMATS:
        raise fail(f"unknown format '{fmt}': choose one of {', '.join(FORMATS)}", exits.USAGE)
    outputs = [Output(fmt, output)]
    for extra_fmt, path in (
        ("json", json_file),
        ("junit", junit_file),
        ("gradescope", gradescope_file),
    ):
        if path is not None:
            outputs.append(Output(extra_fmt, path))
    try:
        session = prepare(
            course_dir, stage or [], weights, timeout, seed, outputs, case or [], sandbox
        )
        override_limits(session, memory_gb, output_kb)
    except Exception as exc:
        raise fail(*_usage_error(exc)) from None
    try:
        if watch:
            from theinference.watch import watch_loop

            code = watch_loop(session, poll)
        else:
            code = run_once(session)
    except KeyboardInterrupt:
        code = exits.INTERRUPTED
    except OSError as exc:  # e.g. a results file that cannot be written
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}", exits.USAGE) from None
    raise typer.Exit(code)


@app.command()
def stages(course_dir: CourseDir = Path(".")) -> None:
    """List the stages in course order, with your last result for each (in a course)."""
    from theinference.progress import read_progress
    from theinference.report import console, print_stages
    from theinference.stages import load_stages

    progress = read_progress(course_dir.expanduser().resolve())
    rows = [
        (
            s.slug,
            s.title,
            ", ".join(s.requires) or "-",
            progress.get(s.slug, {}).get("status", "not run"),
        )
        for s in load_stages()
    ]
    print_stages(console(), rows)


@app.command()
def hint(
    slug: Annotated[str, typer.Argument(help="A stage slug.")], course_dir: CourseDir = Path(".")
) -> None:
    """Show a stage's guidance from the course text (in the course's language's names)."""
    from theinference.languages import LanguageError, course_language, localize
    from theinference.stages import StageError, load_stages, select

    try:
        (found,) = select(load_stages(), [slug])
        language = course_language(course_dir.expanduser().resolve())
    except (StageError, LanguageError) as exc:
        raise fail(str(exc), exits.USAGE) from None
    typer.echo(localize(f"{found.slug}: {found.title}\n\n{found.guidance}", language))


@app.command()
def verify(
    solutions: Annotated[
        Path | None,
        typer.Option(
            help="Folder with reference_kvcache.py and bugs.toml "
            "(default: the source checkout's tests/solutions)."
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Cases of at most 300 tokens only.")
    ] = False,
    bug: Annotated[
        list[str] | None, typer.Option("--bug", help="Only this bug id; repeat for several.")
    ] = None,
    stage: StageOpt = None,
    weights: WeightsOpt = None,
) -> None:
    """For course authors: the reference must pass, every planted bug must fail and be named."""
    from theinference.answer_cache import AnswerCache
    from theinference.grader import Oracle
    from theinference.report import console, print_verify
    from theinference.stages import StageError, load_stages, select
    from theinference.verify import VerifyError, default_solutions_dir
    from theinference.verify import verify as run_verify
    from theinference.weights import WeightsError, cache_dir, load_weights

    try:
        w = load_weights(weights or "synthetic", Path.cwd())
        oracle = Oracle(w, AnswerCache(w.sha256, cache_dir()))
        stages = select(load_stages(), stage or [])
        rows = run_verify(solutions or default_solutions_dir(), stages, w, oracle, quick, bug or [])
    except StageError as exc:
        raise fail(str(exc), exits.USAGE) from None
    except WeightsError as exc:
        raise fail(str(exc), exits.WEIGHTS) from None
    except VerifyError as exc:
        raise fail(str(exc), exits.USAGE) from None
    print_verify(console(), rows, w.label)
    raise typer.Exit(exits.OK if all(r.ok for r in rows) else exits.NOT_PASSED)


@app.command()
def bench(
    course_dir: CourseDir = Path("."),
    weights: WeightsOpt = None,
    lengths: Annotated[
        str, typer.Option(help="Prompt lengths, comma-separated.")
    ] = "16,64,128,256,512",
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per timing.")] = 16,
    repeats: Annotated[int, typer.Option(help="Timed runs per figure (after a warm-up).")] = 3,
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """Time your cached generation against recomputing, over growing prompt lengths."""
    import json

    from theinference.bench import BenchError, to_json
    from theinference.bench import bench as run_bench
    from theinference.course import CourseError, open_course
    from theinference.formats import write_atomically
    from theinference.report import console, print_bench
    from theinference.weights import WeightsError, load_weights

    try:
        sizes = [int(x) for x in lengths.split(",") if x.strip()]
    except ValueError:
        raise fail(f"--lengths must be whole numbers, got '{lengths}'", exits.USAGE) from None
    if new_tokens < 2 or repeats < 1 or not sizes:
        raise fail("need --new-tokens >= 2, --repeats >= 1 and a length", exits.USAGE)
    try:
        course = open_course(course_dir)
        w = load_weights(weights or course.weights, course.root)
        if max(sizes) + new_tokens > w.config.n_ctx:
            raise fail(
                f"a {max(sizes)}-token prompt plus {new_tokens} new tokens exceeds the "
                f"{w.config.n_ctx}-token context",
                exits.USAGE,
            )
        result = run_bench(course.root, w, sizes, new_tokens, repeats, timeout=300)
    except CourseError as exc:
        raise fail(str(exc), exits.COURSE) from None
    except WeightsError as exc:
        raise fail(str(exc), exits.WEIGHTS) from None
    except BenchError as exc:
        raise fail(
            f"{exc}\n(bench needs run_prefill and run_generate working: "
            "theinference test -s generate-loop)",
            exits.NOT_PASSED,
        ) from None
    print_bench(console(), result)
    if json_file is not None:
        write_atomically(json_file, json.dumps(to_json(result), indent=2) + "\n")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


from theinference.classroom import commands as classroom  # noqa: E402
from theinference.classroom import gradescope_commands as gradescope  # noqa: E402
from theinference.classroom import report_commands as class_report  # noqa: E402

app.command()(classroom.grade)
app.add_typer(classroom.gradebook_app, name="gradebook")
app.add_typer(gradescope.gradescope_app, name="gradescope")
app.command()(class_report.report)
app.command()(class_report.summary)
app.add_typer(class_report.workflow_app, name="workflow")


def _usage_error(exc: Exception) -> tuple[str, int]:
    from theinference.course import CourseError
    from theinference.sandbox import SandboxError
    from theinference.stages import StageError
    from theinference.weights import WeightsError

    for kind, code in (
        (CourseError, exits.COURSE),
        (WeightsError, exits.WEIGHTS),
        (StageError, exits.USAGE),
        (SandboxError, exits.USAGE),
    ):
        if isinstance(exc, kind):
            return str(exc), code
    raise exc


def main() -> None:
    app()
