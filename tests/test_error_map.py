"""The error map: where a localised failure departs, as a grid carried in the results and drawn
by the terminal report, the HTML page (rendered in Chromium) and JSON.

The default-suite tests plant a catalogued bug along the cached path (diagnosis/variants.py)
and judge it with the stage's own check, no student process: a few seconds each. The slow
one grades a planted bug end to end through the command line; every planted bug's maps are
checked where tests/test_grading.py grades it (assert_localised_cases_carry_their_map)."""

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from rich.console import Console

from tests.helpers import oracle_answer
from theinference.curriculum.checks import CHECKS
from theinference.curriculum.checks.generate_loop import greedy_tokens
from theinference.curriculum.checks.per_step_identity import plain_sequence_verdict
from theinference.curriculum.checks.swap import Seen
from theinference.curriculum.stages import load_stages
from theinference.diagnosis.variants import VARIANTS
from theinference.oracle import gpt2 as oracle
from theinference.oracle.cached_path import CachedPath
from theinference.oracle.config import GPT2_124M
from theinference.output import html_page, notebook
from theinference.output.formats import SCHEMA_FILE, render
from theinference.output.report import stage_block
from theinference.output.screen import focus_block
from theinference.results import CaseResult, RunResult, StageResult, Status, finding_of
from theinference.results.error_map import MAX_COLUMNS, MAX_ROWS, error_map, numbered

# one worker runs this file: each planted bug graded once (`planted`) serves every test here
pytestmark = pytest.mark.xdist_group("test_error_map")

PROMPT = [464, 2068, 7586, 21831, 18045, 625]  # six tokens
CONTINUATION = [262, 16931, 3290, 13, 198]  # five steps
WIDTH = 72  # the terminal the report is drawn for


def tolerance_of(slug: str):
    (stage,) = [s for s in load_stages() if s.slug == slug]
    return stage.tolerance


def prefill_position_zero(weights) -> CaseResult:
    """prefill-position-zero: every prompt position embedded at wpe[0], so position 0 is
    right and layer 0's K departs at position 1."""
    w, n_layer = weights.tensors, weights.config.n_layer
    kv = CachedPath(w, n_layer).prefill(PROMPT, VARIANTS["prefill-position-zero"]).kv
    pairs = [[layer.k, layer.v] for layer in kv]
    expected = oracle.forward(PROMPT, w, n_layer).kv
    verdict = CHECKS["prefill_cache"].judge(
        pairs, [PROMPT], lambda q: expected, tolerance_of("build-prefill"), weights.config
    )
    return CaseResult(**finding_of(verdict), name="cache after a six-token prompt")


def position_not_advancing(weights) -> CaseResult:
    """position-not-advancing: every decode step at position len(prompt): step 0 is right,
    step 1 departs."""
    w, n_layer = weights.tensors, weights.config.n_layer
    args = [PROMPT, CONTINUATION]
    actual = CachedPath(w, n_layer).answer(
        CHECKS["decode_sequence"].simulate, args, VARIANTS["position-not-advancing"]
    )
    expected = oracle_answer("decode_sequence", args, w, n_layer)
    tol = tolerance_of("per-step-identity")
    verdict = plain_sequence_verdict(actual, args, lambda q: expected, tol, weights.config)
    return CaseResult(**finding_of(verdict), name="five steps after six tokens")


def decode_position_zero(weights) -> CaseResult:
    """position-zero: the decoded token embedded at wpe[0]; its logits depart at its position
    (6, after six prompt tokens), across the vocabulary. Judged as full-decode-step judges a
    case asked again over the student's own cache (a swapped answer that departs)."""
    w, n_layer = weights.tensors, weights.config.n_layer
    args = [PROMPT, CONTINUATION[0]]
    actual = CachedPath(w, n_layer).answer(
        CHECKS["decode_step"].simulate, args, VARIANTS["position-zero"]
    )
    expected = oracle_answer("decode_step", args, w, n_layer)
    verdict = CHECKS["decode_step"].judge(
        (actual, Seen(plan=None, report=None, rerun=True)), args, lambda q: expected,
        tolerance_of("full-decode-step"), weights.config,
    )
    return CaseResult(**finding_of(verdict), name="one token after six")


PLANTED = {  # map shape -> (the planted bug, its stage, the first departing cell expected)
    "layers x positions": (prefill_position_zero, "build-prefill", {"layer": "0", "position": "1"}),
    "steps x token ids": (position_not_advancing, "per-step-identity", {"step": "1"}),
    "position x token ids": (decode_position_zero, "full-decode-step", {"position": "6"}),
}


def stage_of(case: CaseResult, slug: str) -> StageResult:
    return StageResult(slug=slug, title=slug, status=case.status, cases=[case],
                       first_case=case.name, where=case.where)


def terminal(stage: StageResult, colour: bool) -> str:
    out = Console(file=io.StringIO(), width=WIDTH, color_system="truecolor" if colour else None,
                  force_terminal=colour, highlight=False)
    out.print(stage_block(stage))
    return out.file.getvalue()


@pytest.fixture(scope="module", params=list(PLANTED))
def planted(request, weights):
    plant, slug, first_at = PLANTED[request.param]
    case = plant(weights)
    return stage_of(case, slug), first_at


def test_error_map_merges_by_the_worst_and_keeps_the_first_departure():
    """Would catch merging that averages a departure away, a grid past its bounds, or the
    first departure taken in the wrong order (columns before rows) or from the merged grid."""
    ratio = np.full((30, 200), 0.5)  # [rows, columns]
    ratio[17, 150] = 40.0  # the first departure in row order...
    ratio[29, 3] = 2.0  # ...though an earlier column departs in a later row
    found = error_map(ratio, ("layer", numbered(30)), ("position", numbered(200)))
    cells = np.array(found["cells"])
    assert cells.shape == (MAX_ROWS, MAX_COLUMNS)
    assert cells.max() == 40.0 and (cells > 1).sum() == 2
    row, column = found["first"]
    assert cells[row, column] == 40.0
    assert found["first_at"] == {"layer": "17", "position": "150"}
    labels = found["rows"]["labels"]
    assert labels[0].startswith("0–") and labels[-1].endswith("–29")
    assert error_map(np.full((3, 4), 0.9), ("a", numbered(3)), ("b", numbered(4))) is None


def test_the_check_localises_and_maps_the_same_departure(planted):
    """Would catch a map whose first departing cell disagrees with the check's own `where`."""
    stage, first_at = planted
    (case,) = stage.cases
    assert case.status == Status.FAILED and case.error_map is not None
    assert case.error_map["first_at"].items() >= first_at.items()
    for axis, label in first_at.items():
        assert str(case.where[axis]) == label


def test_the_terminal_draws_the_map_within_its_width(planted):
    """Would catch a map wider than the terminal, one missing from a CI log (no colours), or
    a first departure not marked where the results put it."""
    stage, first_at = planted
    (case,) = stage.cases
    plain = terminal(stage, colour=False)
    assert all(len(line) <= WIDTH for line in plain.splitlines())
    grid = plain[plain.index("error map:"):].splitlines()[1:]
    row, column = case.error_map["first"]
    cells_line = grid[row]
    label = case.error_map["rows"]["labels"][row]
    start = cells_line.index(label + " ") + len(label) + 1
    assert cells_line[start + column] == "X" and plain.count("X first departs") == 1
    assert "departs at " + ", ".join(f"{k} {v}" for k, v in case.error_map["first_at"].items()) \
        in plain
    coloured = terminal(stage, colour=True)
    assert "\x1b[" in coloured and "48;2;" in coloured  # cells drawn as background colours
    out = Console(file=io.StringIO(), width=WIDTH, color_system=None)
    out.print(focus_block(stage))  # watch mode's screen
    assert "X first departs at" in out.file.getvalue()


def test_a_generation_maps_each_token_gap_in_one_row():
    """Would catch a generation's map that marks a token accepted as a near-tie, or one that
    does not fit a one-row grid in the terminal."""
    logits = np.zeros((40, 50))  # [tokens, vocab]
    logits[:, 7] = 1.0  # the argmax at every step
    logits[3, 9] = 1.0 - 1e-3  # a near-tie at token 3, within the tolerance
    logits[5, 2] = -4.0  # token 5: far below the argmax
    yours = [7] * 40
    yours[3], yours[5] = 9, 2
    tol = tolerance_of("generate-loop")
    verdict = greedy_tokens(np.array(yours), [[1, 2], 40], lambda q: logits, tol, GPT2_124M)
    assert verdict.where == {"token": 5, "position": 7}
    assert verdict.error_map["first_at"] == {"gap": "argmax − yours", "token": "5"}
    case = CaseResult(**finding_of(verdict), name="forty tokens")
    plain = terminal(stage_of(case, "generate-loop"), colour=False)
    grid = plain[plain.index("error map:"):].splitlines()
    assert grid[1].rstrip().endswith(" " + "." * 5 + "X" + "." * 34)  # the near-tie a dot


def test_json_carries_the_map_and_matches_the_schema(planted):
    """Would catch JSON without the map's cells, axes or first cell, or a schema that does not
    describe them."""
    stage, first_at = planted
    run = RunResult(stages=[stage], weights_label="synthetic", weights_sha256="0")
    data = json.loads(render(run, "json"))
    mapped = data["stages"][0]["cases"][0]["error_map"]
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.validate(mapped, {"$ref": "#/$defs/error_map", "$defs": schema["$defs"]})
    jsonschema.validate(data["stages"][0], {"$ref": "#/$defs/stage", "$defs": schema["$defs"]})
    assert mapped == stage.cases[0].error_map
    assert mapped["first_at"].items() >= first_at.items()


def test_a_decode_maps_its_logits_departing_everywhere(weights):
    """Would catch full-decode-step drawing no map for a position bug (the seed's own stage),
    or one that does not show the departure across the whole vocabulary at its position."""
    case = decode_position_zero(weights)
    assert case.error_map["rows"] == {"name": "position", "labels": ["6"]}
    assert case.error_map["columns"]["name"] == "token id"
    assert len(case.error_map["cells"][0]) == MAX_COLUMNS and min(case.error_map["cells"][0]) > 1


def test_the_notebook_draws_each_map_as_svg(planted):
    """Would catch a notebook check's output without a stage's map (the decode's among them),
    or with another cell marked first."""
    stage, first_at = planted
    page = notebook.check_html(RunResult([stage], "synthetic", "0"), [])
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg"') == 1
    assert page.count('class="first"') == 1
    first = ", ".join(f"{k} {v}" for k, v in stage.cases[0].error_map["first_at"].items())
    assert f'<span class="first-at">{first}</span>' in page


@pytest.mark.parametrize("plant", [prefill_position_zero, decode_position_zero],
                         ids=["cache", "decode"])
def test_the_html_page_shows_the_map_in_chromium(weights, tmp_path, plant):
    """Would catch a page Chromium cannot render, one that fetches anything, or an SVG map
    whose marked cell is not the first departure, or a page without the diagnosis."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    slug = "build-prefill" if plant is prefill_position_zero else "full-decode-step"
    stage = stage_of(plant(weights), slug)
    stage.bug_name, stage.hint = "every prompt position at wpe[0]", "use positions 0..n-1"
    first = ", ".join(f"{k} {v}" for k, v in stage.cases[0].error_map["first_at"].items())
    page = tmp_path / "run.html"
    page.write_text(render(RunResult([stage], "synthetic", "0"), "html"))
    text = page.read_text()
    assert "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    dom = dump_dom(chromium, page, tmp_path)
    marked = re.search(r'<rect x="(\d+)" y="(\d+)" width="(\d+)"[^>]*class="first"', dom)
    row, column = stage.cases[0].error_map["first"]
    x, y, width = (int(v) for v in marked.groups())
    assert (y - html_page.TOP) // html_page.CELL == row and (x - html_page.LABEL) // width == column
    assert f'<span class="first-at">{first}</span>' in dom
    assert "every prompt position at wpe[0]" in dom and "use positions 0..n-1" in dom
    assert f"X first departs at {first}" in dom  # the report's text, below


def dump_dom(chromium: str, page: Path, tmp: Path) -> str:
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             f"--user-data-dir={tmp / 'profile'}"]
    run = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "net::ERR" not in run.stderr, run.stderr[-2000:]
    return run.stdout


@pytest.mark.slow
def test_theinference_test_writes_the_map_to_the_log_json_and_page(tmp_path, weights):
    """Would catch `theinference test` with a planted off-by-one position (prefill-position-
    zero) whose log, --json file or --html page lacks the map or marks another first cell."""
    from typer.testing import CliRunner

    from tests.bugs import planted as planted_text
    from tests.helpers import make_course
    from theinference.cli import app

    course = make_course(tmp_path / "course", planted_text("prefill-position-zero"))
    results, page = tmp_path / "run.json", tmp_path / "run.html"
    done = CliRunner().invoke(
        app, ["test", "-C", str(course), "-s", "build-prefill", "--timeout", "600",
              "--json", str(results), "--html", str(page)], env={"COLUMNS": "80"})
    assert done.exit_code == 1, done.output
    assert "X first departs at layer 0, position 1" in done.output
    cases = json.loads(results.read_text())["stages"][-1]["cases"]
    maps = [c["error_map"] for c in cases if c["error_map"]]
    assert maps and all(m["first_at"] == {"layer": "0", "position": "1"} for m in maps)
    assert '<span class="first-at">layer 0, position 1</span>' in page.read_text()
