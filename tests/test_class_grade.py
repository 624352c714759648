"""`theinference grade` on a small class in every layout (course folders, .zip, .tar.gz, loose
files, a refused archive), with planted bugs and hostile submissions, at --jobs 2: every row
right, gradebook, report and Gradescope results agreeing with the per-submission JSON, a rerun
grading nothing, two shards merged equal to one run. Grades one small case to stay fast
(test_class_grade_slow.py grades a class on every stage)."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import classroom_helpers as ch
from tests.bugs import planted
from tests.test_hostile import SUBMISSIONS
from theinference.cli import app
from theinference.results.json_form import SCHEMA

# one worker runs this file: the class graded once (`graded`) serves every test here
pytestmark = pytest.mark.xdist_group("test_class_grade")

runner = CliRunner()
SETTINGS = '[grading]\ntimeout = 10\nscores = { "single-step-attention" = 2 }\n'
OPTIONS = ["-s", "single-step-attention", "--case", "one token repeated 16 times", "--jobs", "2"]
EXPECTED = {
    # student: (record status, single-step-attention status, suspected bug)
    "ref-dir": ("graded", "passed", None),
    "ref-zip": ("graded", "passed", None),
    "ref-tar": ("graded", "passed", None),
    "independent-loose": ("graded", "passed", None),
    "stubs": ("graded", "todo", None),
    "bug-attend-old-length": ("graded", "failed", "attend-old-length"),
    "bug-causal-mask-in-step": ("graded", "failed", "causal-mask-in-step"),
    "hostile-raises": ("graded", "error", None),
    "hostile-segfault": ("graded", "error", None),
    "hostile-loops-forever": ("graded", "timeout", None),
    "hostile-floods-output": ("graded", "passed", None),
    "hostile-exits": ("graded", "error", None),
    "hostile-kills-itself": ("graded", "error", None),
    "hostile-returns-nan": ("graded", "failed", None),
    "hostile-patches-allclose": ("graded", "failed", None),
    "hostile-leaves-a-child": ("graded", "passed", None),
    "zip-slip": ("rejected", "not graded", None),
}
# more of test_hostile.py's catalogue, each a row of its own in every layout
HOSTILE = {
    "hostile-exits": "calls os._exit(0)",
    "hostile-kills-itself": "kills itself with SIGKILL",
    "hostile-returns-nan": "returns NaN",
    "hostile-patches-allclose": "monkeypatches numpy.allclose",
    "hostile-leaves-a-child": "leaves a child process running",
}


def make_class(folder: Path) -> Path:
    folder.mkdir()
    ref = ch.reference()
    ch.add(folder, "ref-dir", ref)
    ch.add(folder, "ref-zip", ref, "zip")
    ch.add(folder, "ref-tar", ref, "tar")
    ch.add(folder, "independent-loose", ch.independent(), "loose")
    ch.add(folder, "stubs", None)
    for bug in ("attend-old-length", "causal-mask-in-step"):
        ch.add(folder, f"bug-{bug}", planted(bug), "zip")
    ch.add(folder, "hostile-raises", ref, "loose", SUBMISSIONS["raises an exception"][0])
    ch.add(folder, "hostile-segfault", ref, "dir", SUBMISSIONS["segfaults through ctypes"][0])
    ch.add(folder, "hostile-loops-forever", ref, "tar", "while True: pass")
    flood = ("sys.stdout.write('x' * 5_000_000)\n    "
             "return layer_attn_incremental(embed(seq_ids, w), w, 0)[-1]")
    ch.add(folder, "hostile-floods-output", ref, "dir", flood)
    layouts = ("zip", "tar", "loose", "dir", "zip")
    for (sid, name), layout in zip(HOSTILE.items(), layouts, strict=True):
        ch.add(folder, sid, ref, layout, SUBMISSIONS[name][0])
    ch.as_zip(folder / "zip-slip.zip", {"../../escaped.py": b"x = 1\n"})
    return folder


def grade(subs: Path, out: Path, course: Path, *extra: str):
    result = runner.invoke(app, ["grade", str(subs), "--out", str(out), "-C", str(course),
                                 *OPTIONS, *extra])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def graded(tmp_path_factory, weights):
    root = tmp_path_factory.mktemp("class")
    course = ch.make_course(root / "instructor")
    (course / "theinference.toml").write_text(SETTINGS)
    subs = make_class(root / "submissions")
    first = grade(subs, root / "results", course)
    return root, subs, course, first


def records(results: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (results / "submissions").glob("*.json")}


def test_every_row_is_right(graded):
    """Would catch a wrong verdict, a lost submission, a layout graded as the template, or a
    hostile submission taking the class run down instead of getting its own row."""
    root, _, _, first = graded
    assert first.exit_code == 0, first.output
    got = records(root / "results")
    assert set(got) == set(EXPECTED)
    for sid, (status, stage_status, bug) in EXPECTED.items():
        (stage,) = got[sid]["stages"]
        assert (got[sid]["status"], stage["status"]) == (status, stage_status), sid
        if bug:
            assert stage["suspected_bug"] == bug, sid
        assert stage["score"] == (2.0 if stage_status == "passed" else 0.0)
    assert "outside" in got["zip-slip"]["message"]
    assert not (root / "escaped.py").exists() and not (root.parent / "escaped.py").exists()


def test_the_gradebook_agrees_with_the_json(graded):
    """Would catch a gradebook column that drifts from the per-submission JSON."""
    root = graded[0]
    got = records(root / "results")
    with (root / "results" / "gradebook.csv").open() as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(got)
    for sid, record in got.items():
        row = rows[sid]
        assert row["status"] == record["status"]
        assert float(row["single-step-attention"]) == record["stages"][0]["score"]
        assert float(row["total"]) == record["score"] and float(row["max_total"]) == 2.0
        bug = record["stages"][0]["suspected_bug"]
        assert (bug or "") in row["suspected_bugs"]
        test_json = record["results"]
        if test_json is not None:  # the same JSON `theinference test` writes
            assert test_json["schema"] == SCHEMA
            assert test_json["stages"][0]["status"] == record["stages"][0]["status"]


def test_a_rerun_regrades_nothing(graded):
    """Would catch resumability broken: every submission graded again though unchanged."""
    root, subs, course, _ = graded
    before = {sid: r["seconds"] for sid, r in records(root / "results").items()}
    again = grade(subs, root / "results", course)
    assert again.exit_code == 0
    assert f"{len(EXPECTED) - 1} unchanged" in again.output  # the refused archive is re-read
    after = records(root / "results")
    assert all(after[sid]["seconds"] == before[sid] for sid in before if sid != "zip-slip")


def test_two_shards_merged_equal_one_run(graded):
    """Would catch a shard that drops or duplicates a student, or a merge that differs from
    grading the class at once."""
    root, subs, course, _ = graded
    for i in (1, 2):
        shard = root / f"shard{i}"
        shutil.copytree(root / "results", shard)  # the warm oracle is shared; records are not
        shutil.rmtree(shard / "submissions")
        shard.joinpath("gradebook.csv").unlink()
        assert grade(subs, shard, course, "--shard", f"{i}/2").exit_code == 0
    ids = [set(records(root / f"shard{i}")) for i in (1, 2)]
    assert ids[0] and ids[1] and not ids[0] & ids[1] and ids[0] | ids[1] == set(EXPECTED)
    merged = runner.invoke(app, ["gradebook", "merge", str(root / "shard1"), str(root / "shard2"),
                                 "--out", str(root / "merged")])
    assert merged.exit_code == 0, merged.output
    one_shot = (root / "results" / "gradebook.csv").read_text()
    assert (root / "merged" / "gradebook.csv").read_text() == one_shot


def test_the_class_report_agrees_and_renders_in_chromium(graded, tmp_path):
    """Would catch a report whose figures differ from the records, a broken student link, a
    page that fetches anything, or one a real browser cannot render."""
    from theinference.classroom.class_report import class_summary
    from theinference.results.submission import record_from_json

    root = graded[0]
    html = tmp_path / "class.html"
    result = runner.invoke(app, ["report", str(root / "results"), "--html", str(html)])
    assert result.exit_code == 0, result.output
    got = records(root / "results")
    summary = class_summary([record_from_json(r) for r in sorted(got.values(),
                                                                key=lambda r: r["id"])])
    graded_ids = [s for s, e in EXPECTED.items() if e[0] == "graded"]
    passing = [s for s in graded_ids if EXPECTED[s][1] == "passed"]
    assert summary["pass_rate"]["single-step-attention"] == len(passing) / len(graded_ids)
    text = html.read_text()
    assert f"{len(passing) / len(graded_ids) * 100:.0f}%" in text
    assert "attend-old-length" in text and "causal-mask-in-step" in text
    assert "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    for sid in EXPECTED:
        assert (tmp_path / "class-students" / f"{sid}.html").is_file()
        assert f'href="class-students/{sid}.html"' in text
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    dom, png = render(chromium, html, tmp_path)
    assert "Pass rate per stage" in dom and "<svg" in dom and "ref-zip" in dom
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def render(chromium: str, html: Path, tmp: Path) -> tuple[str, bytes]:
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             f"--user-data-dir={tmp / 'profile'}", "--window-size=1000,1800"]
    dom = subprocess.run([*flags, "--dump-dom", html.as_uri()], capture_output=True, text=True,
                         timeout=120)
    shot = subprocess.run([*flags, f"--screenshot={tmp / 'class.png'}", html.as_uri()],
                          capture_output=True, text=True, timeout=120)
    for run in (dom, shot):
        assert run.returncode == 0, run.stderr[-2000:]
        assert "Uncaught" not in run.stderr and "net::ERR" not in run.stderr, run.stderr[-2000:]
    return dom.stdout, (tmp / "class.png").read_bytes()


def test_every_record_says_what_its_job_had(graded, tmp_path):
    """Would catch a record, a student page or the class report that does not say what the
    job grading it had (its CPUs as BLAS threads and memory, shared out of the allocation,
    and where those figures came from), or a job given more CPUs than the allocation has."""
    from theinference.grading.allocation import read_allocation

    root = graded[0]
    here = read_allocation()
    for sid, record in records(root / "results").items():
        share = record["allocation"]
        if record["status"] == "rejected":  # nothing ran
            assert share is None, sid
            continue
        assert (share["allocation_cpus"], share["cpus_from"]) == (here.cpus, here.cpus_from)
        assert 1 <= share["jobs"] <= 2 and share["cpus"] * share["jobs"] <= here.cpus, share
        assert share["memory_bytes"] * share["jobs"] <= share["allocation_memory_bytes"]
    html = tmp_path / "class.html"
    assert runner.invoke(app, ["report", str(root / "results"), "--html",
                               str(html)]).exit_code == 0
    text = html.read_text()
    assert "<section id=allocation>" in text and f"({here.cpus_from})" in text
    page = (tmp_path / "class-students" / "ref-dir.html").read_text()
    assert "Graded with sandbox" in page and "at once, of" in page


def test_grading_refuses_bad_usage_clearly(tmp_path):
    """Would catch a bad --shard or a missing folder ending in a traceback."""
    for args in (["grade", str(tmp_path), "--out", str(tmp_path / "o"), "--shard", "3/2"],
                 ["grade", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output


def test_cli_entry_is_importable():
    """Would catch the class commands missing from `theinference --help`."""
    out = subprocess.run([sys.executable, "-m", "theinference", "--help"], capture_output=True,
                         text=True, timeout=60)
    for command in ("grade", "gradebook", "gradescope", "report", "workflow", "summary"):
        assert command in out.stdout
