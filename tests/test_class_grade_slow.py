"""The whole class (slow): generated submissions (the paged solution, and the first planted
bug of each of the first two stages (tests/solutions/bugs.toml), as a loose file, a folder and
an archive) graded on the first three stages, every case, at --jobs 2: every row right, the
gradebook and class report agreeing with the JSON, a rerun grading nothing. (Every planted bug
is graded and named on its stage by tests/test_grading.py, as `verify` grades it, so a bug's
row here needs no later stage: a row failing at build-prefill has a stage passed before it and
the stage after it skipped, as a row failing at a later stage has; every stage of the course
graded at full size is tests/test_grading.py's, the reference's, and the floors' stages of
other layouts tests/test_cache_layouts.py's; hostile submissions, each a row of its own, and
the two-shard merge are checked on the small class in test_class_grade.py, at the stage they
break, every layout of a submission among them.)"""

import csv
import json

import pytest
from typer.testing import CliRunner

from tests import classroom_helpers as ch
from tests.bugs import BUGS, planted
from tests.helpers import SOLUTIONS, STAGES
from theinference.cli import app

runner = CliRunner()
LAYOUTS = ("dir", "zip")  # the bugs'; the paged solution loose
GRADED = STAGES[:3]  # the bugs' stages and one after them


# a bug of each of the first two stages: a bug's row holds stages passed, its own failed and
# later ones skipped; a bug of a later stage would cost the whole course before it
BUG_A_STAGE = [next(b for b in BUGS if b.stage == stage) for stage in STAGES[:2]]


@pytest.mark.slow
def test_a_class_grades_right(tmp_path, weights):
    """Would catch any wrong row in a realistic class: a bug graded as a pass, a correct
    solution failing, a layout mis-read, a stage after a failing one graded wrong; and the
    gradebook, report or resume disagreeing with the per-submission JSON."""
    subs = tmp_path / "submissions"
    subs.mkdir()
    # a correct row: the paged solution, K/V in blocks through a table (the reference's every
    # stage and case: tests/test_grading.py; the independent solution's float64 on every
    # stage: tests/test_cache_layouts.py, and slow float64 caches at the floors' stages:
    # tests/test_swap_beside_floor.py)
    ch.add(subs, "paged", (SOLUTIONS / "paged_kvcache.py").read_text(), "loose")
    expected = {"paged": {}}
    for i, bug in enumerate(BUG_A_STAGE):
        ch.add(subs, f"bug-{bug.id}", planted(bug.id), LAYOUTS[i])
        expected[f"bug-{bug.id}"] = {bug.stage: bug.fingerprint}
    assert len(expected) == 1 + 2
    out = tmp_path / "results"
    only = [arg for slug in GRADED for arg in ("--stage", slug)]
    result = runner.invoke(app, ["grade", str(subs), "--out", str(out), "--jobs", "2", *only])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    got = {p.stem: json.loads(p.read_text()) for p in (out / "submissions").glob("*.json")}
    assert set(got) == set(expected)
    for sid, want in expected.items():
        stages = {s["slug"]: s for s in got[sid]["stages"]}
        assert list(stages) == GRADED and got[sid]["status"] == "graded", sid
        if sid == "paged":
            assert all(s["status"] == "passed" for s in stages.values()), (sid, stages)
        else:
            ((slug, fingerprint),) = want.items()
            assert stages[slug]["status"] != "passed", sid
            if stages[slug]["status"] == "skipped":  # the bug breaks an earlier stage too
                assert any(s["status"] in ("failed", "error") for s in stages.values()), sid
            elif fingerprint:
                assert stages[slug]["suspected_bug"] == fingerprint, (sid, stages[slug])
    with (out / "gradebook.csv").open() as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    for sid, record in got.items():
        assert float(rows[sid]["total"]) == record["score"]
        assert [float(rows[sid][slug]) for slug in GRADED] == [s["score"] for s in
                                                                record["stages"]]
    html = tmp_path / "class.html"
    assert runner.invoke(app, ["report", str(out), "--html", str(html)]).exit_code == 0
    from theinference.classroom.class_report import class_summary
    from theinference.results.submission import record_from_json

    summary = class_summary([record_from_json(r) for r in sorted(got.values(),
                                                                key=lambda r: r["id"])])
    for slug in GRADED:
        passing = sum(r["stages"][GRADED.index(slug)]["status"] == "passed" for r in got.values())
        assert summary["pass_rate"][slug] == passing / len(got)
        assert f"{passing / len(got) * 100:.0f}%" in html.read_text()
    again = runner.invoke(app, ["grade", str(subs), "--out", str(out), "--jobs", "2", *only])
    assert f"({len(expected)} unchanged" in again.output, again.output
