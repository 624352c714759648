"""`theinference gradebook merge` and `gradebook diff`: joining shards' results, and what moved
between two results folders (classroom/gradebook.py, classroom/regrade.py)."""

from pathlib import Path
from typing import Annotated

import typer

from theinference import exits
from theinference.commands.grade import fail
from theinference.commands.options import command_group

gradebook_app = command_group("Gradebooks of graded classes.")


@gradebook_app.command("merge")
def gradebook_merge(
    results: Annotated[list[Path], typer.Argument(help="Results folders (e.g. one per shard).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the joined results.")],
    submissions: Annotated[
        Path | None,
        typer.Option(help="The class's submissions folder: keep exactly its students, drop "
                          "the records of the others, list those no shard graded."),
    ] = None,
) -> None:
    """Join shards' results into one folder with one gradebook.csv.

    Exit 0: merged; 1: some student of --submissions has no record (a "missing" row), or the
    grader could not finish some submission (as `grade`'s exit 1)."""
    from theinference.classroom.gradebook import MergeError, merge

    students = None if submissions is None else class_ids(submissions)
    try:
        merged = merge(results, out, students)
    except MergeError as exc:
        raise fail(str(exc), exits.USAGE) from None
    typer.echo(f"{len(merged.records)} submissions -> {out / 'gradebook.csv'}")
    finished = say_merged(merged, submissions)
    raise typer.Exit(exits.OK if finished else exits.UNFINISHED)


def say_merged(merged, submissions: Path | None) -> bool:
    """The merge's sandboxes, dropped records, missing and unfinished students said; whether
    every student of the class has a finished grade."""
    from collections import Counter

    sandboxes = Counter(r.sandbox or "not run" for r in merged.records)
    if sandboxes:
        typer.echo("sandbox: " + ", ".join(f"{k} {n}" for k, n in sorted(sandboxes.items())))
    if merged.dropped:
        typer.echo(f"dropped {len(merged.dropped)} (their submission is gone from "
                   f"{submissions}): {', '.join(merged.dropped)}")
    if merged.missing:
        typer.echo(f"missing {len(merged.missing)} (no shard graded them; their row says "
                   f"missing): {', '.join(merged.missing)}", err=True)
    unfinished = [r.id for r in merged.records if r.status == "grader-error"]
    if unfinished:
        typer.echo(f"unfinished {len(unfinished)} (the grader could not finish them; grade "
                   f"again to retry): {', '.join(unfinished)}", err=True)
    return not merged.missing and not unfinished


def class_ids(submissions: Path) -> list[str]:
    """The students of a submissions folder, as `grade` would find them."""
    from theinference.classroom.intake import IntakeError, discover

    try:
        found, _skipped = discover(submissions)
    except (IntakeError, OSError) as exc:
        raise fail(f"cannot read {submissions}: {exc}", exits.USAGE) from None
    return [s.id for s in found]


@gradebook_app.command("diff")
def gradebook_diff(
    old: Annotated[Path, typer.Argument(help="The earlier results folder.")],
    new: Annotated[Path, typer.Argument(help="The later results folder (the regrade).")],
    csv_file: Annotated[Path | None, typer.Option("--csv", help="Also write the changes here.")]
    = None,
) -> None:
    """Whose grade changed between two results folders, and why.

    Per student and stage: old and new status and score, suspected bug, worst error, cases
    added or removed, and the recorded inputs that differ (grader, specs, settings, weights,
    seed; content for a resubmission). Exit 0: no grade changed; 1: some did."""
    from theinference.atomic import atomic_write
    from theinference.classroom.records import SUBMISSIONS_DIR, read_records
    from theinference.classroom.regrade import csv_text, diff_records, text

    for folder in (old, new):
        if not (folder / SUBMISSIONS_DIR).is_dir():
            raise fail(f"{folder} holds no graded submissions ({SUBMISSIONS_DIR}/)", exits.USAGE)
    regrade = diff_records(read_records(old), read_records(new))
    typer.echo(text(regrade), nl=False)
    if csv_file is not None:
        atomic_write(csv_file, csv_text(regrade))
        typer.echo(f"wrote {csv_file}", err=True)  # as every command says what it wrote
    raise typer.Exit(exits.NOT_PASSED if regrade.changes else exits.OK)
