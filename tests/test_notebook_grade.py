"""`theinference grade` on a class of notebook submissions beside the equivalent course
directories: a filled-in course notebook grades to the same gradebook row as the course
directory of the same code (as an .ipynb, or alone in a folder, Gradescope's layout), a planted
bug is named the same, and an unreadable notebook or one with no code gets a row saying why
while the rest of the class is graded. One small case, as tests/test_class_grade.py does."""

import csv

import nbformat
import pytest
from typer.testing import CliRunner

from tests import classroom_helpers as ch
from tests import notebook_helpers as nh
from tests.bugs import planted
from theinference.cli import app

OPTIONS = ["-s", "single-step-attention", "--case", "one token repeated 16 times", "--jobs", "2"]
BUG = "attend-old-length"
SAME = {  # a notebook submission -> the course directory it must grade the same as
    "nb-ref": "dir-ref",
    "nb-in-folder": "dir-ref",
    "nb-bug": "dir-bug",
    "nb-untouched": "dir-stubs",
}
REFUSED = {  # a submission -> what its row must say
    "nb-malformed": "JSON is malformed",
    "nb-no-code": "defines no function or class",
    "nb-two": "2 notebooks and no kvcache.py",
    "zip-broken": "not a readable .zip",  # the same row for an archive, for comparison
}

# one worker runs this file: the class `gradebook` grades serves both tests
pytestmark = pytest.mark.xdist_group("test_notebook_grade")


def write_notebook(path, solution: str | None) -> None:
    nb = nh.in_memory() if solution is None else nh.filled(nh.in_memory(), solution)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def make_class(folder):
    folder.mkdir()
    ref, bug = ch.reference(), planted(BUG)
    ch.add(folder, "dir-ref", ref)
    ch.add(folder, "dir-bug", bug, "zip")
    ch.add(folder, "dir-stubs", None)
    write_notebook(folder / "nb-ref.ipynb", ref)
    write_notebook(folder / "nb-in-folder" / "submission" / "work.ipynb", ref)
    checkpoints = folder / "nb-in-folder" / "submission" / ".ipynb_checkpoints"
    write_notebook(checkpoints / "work-checkpoint.ipynb", None)  # Jupyter's autosave
    write_notebook(folder / "nb-bug.ipynb", bug)
    write_notebook(folder / "nb-untouched.ipynb", None)
    (folder / "nb-malformed.ipynb").write_text('{"cells": [{"cell_type": "code", ')
    markdown_only = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# notes")])
    nbformat.write(markdown_only, folder / "nb-no-code.ipynb")
    write_notebook(folder / "nb-two" / "a.ipynb", ref)
    write_notebook(folder / "nb-two" / "b.ipynb", ref)
    (folder / "zip-broken.zip").write_bytes(b"PK\x03\x04 not really")
    return folder


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory, weights):
    root = tmp_path_factory.mktemp("notebook-class")
    course = ch.make_course(root / "instructor")
    (course / "theinference.toml").write_text("[grading]\ntimeout = 20\n")
    subs = make_class(root / "submissions")
    result = CliRunner().invoke(app, ["grade", str(subs), "--out", str(root / "results"),
                                      "-C", str(course), *OPTIONS])
    assert "Traceback" not in result.output, result.output
    with (root / "results" / "gradebook.csv").open() as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def comparable(row: dict) -> dict:
    """A row without what names the student and hashes their files."""
    return {k: v for k, v in row.items() if k not in ("student", "content_sha256")}


def test_a_notebook_grades_to_the_row_of_its_course_directory(gradebook):
    """Would catch a notebook's code graded differently from the same code in a course
    directory: a lost definition, stubs that win over it, a bug not named, an untouched
    notebook that errors instead of being todo, Jupyter's autosaved copy taken for a second
    notebook."""
    assert gradebook["dir-ref"]["status"] == "graded"
    assert gradebook["dir-ref"]["single-step-attention"] == "1"
    assert BUG in gradebook["dir-bug"]["suspected_bugs"]
    for notebook, directory in SAME.items():
        assert comparable(gradebook[notebook]) == comparable(gradebook[directory]), notebook


def test_a_notebook_that_cannot_be_graded_gets_a_row_saying_why(gradebook):
    """Would catch a malformed notebook, one with no code or one of two taking the class run
    down, or rejected without a message a student can act on."""
    assert set(gradebook) == set(SAME) | set(SAME.values()) | set(REFUSED)
    for sid, said in REFUSED.items():
        row = gradebook[sid]
        assert row["status"] == "rejected" and said in row["message"], row
        assert row["total"] == "0"
    refused_notebook = comparable(gradebook["nb-malformed"])
    refused_archive = comparable(gradebook["zip-broken"])
    assert {k: v for k, v in refused_notebook.items() if k != "message"} == {
        k: v for k, v in refused_archive.items() if k != "message"}
