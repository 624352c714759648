"""Provenance and `gradebook diff`: a class graded, then regraded after the instructor changed
one stage's points and added seeded hidden cases (while one student resubmitted), names
exactly the students and stages whose grade moved and the recorded inputs behind it; a
regrade that changes nothing diffs empty. Small on purpose: one stage, its one-token cases."""

import csv
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import classroom_helpers as ch
from theinference.classroom.regrade import diff_records
from theinference.cli import app
from theinference.grading.provenance import flatten
from theinference.results.submission import record_from_json

# one worker runs this file: the class graded twice once (`regraded`) serves every test here
pytestmark = pytest.mark.xdist_group("test_regrade")

runner = CliRunner()
BEFORE = '[grading]\nseed = "none"\n'
AFTER = '[grading]\nseed = 7\nscores = { "single-step-attention" = 3 }\n'  # hidden: 208, 230 tokens
OPTIONS = ["-s", "single-step-attention", "--case", "one token", "--case", "hidden", "--jobs", "2"]
# attends over the last 16 positions only: right on the public one-token cases (16 at most),
# wrong on any longer sequence, as the hidden cases are
WINDOW = "return layer_attn_incremental(embed(seq_ids, w)[-16:], w, 0)[-1]"


def grade(subs: Path, out: Path, course: Path) -> None:
    result = runner.invoke(app, ["grade", str(subs), "--out", str(out), "-C", str(course),
                                 *OPTIONS])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output


@pytest.fixture(scope="module")
def regraded(tmp_path_factory, weights):
    root = tmp_path_factory.mktemp("regrade")
    course = ch.make_course(root / "instructor")
    first, second = root / "subs-1", root / "subs-2"
    first.mkdir()
    ch.add(first, "ref", ch.reference())
    ch.add(first, "window", ch.reference(), "dir", WINDOW)
    ch.add(first, "stubs", None)
    ch.add(first, "resubmits", None, "zip")
    shutil.copytree(first, second)
    (second / "resubmits.zip").unlink()
    ch.add(second, "resubmits", ch.reference(), "zip", scratch=root / "scratch-2")
    (course / "theinference.toml").write_text(BEFORE)
    grade(first, root / "before", course)
    grade(first, root / "again", course)  # nothing changed: a fresh folder, graded anew
    (course / "theinference.toml").write_text(AFTER)
    grade(second, root / "after", course)
    return root


def diff(root: Path, old: str, new: str, *extra: str):
    return runner.invoke(app, ["gradebook", "diff", str(root / old), str(root / new), *extra])


def test_a_regrade_names_exactly_whose_grade_moved_and_why(regraded, tmp_path):
    """Would catch a diff that misses a student whose stage fell to a new hidden case, lists
    one whose grade did not move, or cannot tell the instructor's changes (settings, seed)
    from a student's resubmission (content)."""
    result = diff(regraded, "before", "after", "--csv", str(tmp_path / "changes.csv"))
    assert result.exit_code == 1, result.output
    with (tmp_path / "changes.csv").open() as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"ref", "window", "resubmits"}  # stubs: todo before and after
    assert all(row["stage"] == "single-step-attention" for row in rows.values())
    moves = {sid: (r["old_status"], r["new_status"], r["old_score"], r["new_score"])
             for sid, r in rows.items()}
    assert moves == {"ref": ("passed", "passed", "1", "3"),
                     # its public cases still pass: their share of the 3 points (2 of 4 cases)
                     "window": ("passed", "failed", "1", "1.5"),
                     "resubmits": ("todo", "passed", "0", "3")}
    assert rows["ref"]["changed_provenance"] == "seed; settings"
    assert rows["resubmits"]["changed_provenance"] == "content; seed; settings"
    assert rows["window"]["cases_added"] == "hidden case 1; hidden case 2"
    assert float(rows["window"]["worst_error"]) > 1
    assert "window single-step-attention: passed -> failed" in result.output
    assert "settings (4 of 4)" in result.output and "content (1 of 4)" in result.output


def test_an_unchanged_regrade_diffs_empty(regraded):
    """Would catch provenance that varies from run to run (a time, a temporary path) or a
    diff that reports grades which did not move."""
    result = diff(regraded, "before", "again")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("no change: 4 students")


def test_records_carry_provenance_and_never_the_seed(regraded):
    """Would catch a record without what produced it, or one that writes the seed."""
    record = json.loads((regraded / "after" / "submissions" / "ref.json").read_text())
    fields = flatten(record["provenance"])
    for name in ("theinference", "specs.single-step-attention", "settings", "weights", "seed",
                 "sandbox", "platform"):
        assert fields.get(name), name
    assert fields["seed"].startswith("fixed ") and fields["seed"] != "fixed 7"
    assert record["results"]["provenance"]["weights"] == record["provenance"]["weights"]
    assert record["code"]["src/kvcache.py"] == ch.reference()


def test_the_class_report_shows_the_changes(regraded, tmp_path):
    """Would catch `report --since` leaving out a change or its reason."""
    html = tmp_path / "class.html"
    result = runner.invoke(app, ["report", str(regraded / "after"), "--html", str(html),
                                 "--since", str(regraded / "before")])
    assert result.exit_code == 0, result.output
    text = html.read_text()
    section = text[text.index("<section id=changes>"):]
    section = section[: section.index("</section>")]
    assert section.count("<tr><td>") == 3 and "window" in section and "content" in section


def test_a_changed_spec_is_named(regraded):
    """Would catch a tolerance or case-list change in a stage spec going unnamed."""
    old = json.loads((regraded / "before" / "submissions" / "window.json").read_text())
    new = json.loads(json.dumps(old))
    new["provenance"]["specs"]["single-step-attention"] = "0" * 16
    new["stages"][0].update(status="failed", score=0.0)
    (change,) = diff_records([record_from_json(old)], [record_from_json(new)]).changes
    assert change.because == ["specs.single-step-attention"]


def test_diff_refuses_a_folder_without_results(tmp_path):
    """Would catch a traceback, or exit 0, for a folder that is not a results folder."""
    result = runner.invoke(app, ["gradebook", "diff", str(tmp_path), str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_hostile_student_id_stays_text(regraded):
    """Would catch a student id (a file name) reaching the terminal as an escape sequence or
    a spreadsheet as a formula through the diff."""
    from theinference.classroom.regrade import csv_text, text

    old = json.loads((regraded / "before" / "submissions" / "window.json").read_text())
    new = json.loads(json.dumps(old))
    for record in (old, new):
        record["id"] = "=HYPERLINK(1)\x1b[2K"
    new["stages"][0].update(status="failed", score=0.0)
    regrade = diff_records([record_from_json(old)], [record_from_json(new)])
    assert "\x1b" not in text(regrade) and "\\x1b[2K" in text(regrade)
    assert "\n'=HYPERLINK(1)" in csv_text(regrade)
