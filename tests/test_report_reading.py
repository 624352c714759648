"""The report a student reads: logs without padding in every form, the noise line, the stage's
diagnosis first, failures alike in one table, and a stage with one bug on one screen.

The synthetic stage is a planted bug along the cached path judged by the stage's own check (no
student process, a few seconds); the one-screen test grades a planted bug end to end."""

import io
import re
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from tests.bugs import planted
from tests.helpers import grade_course, make_course
from tests.test_error_map import prefill_position_zero
from theinference.course.languages import TYPESCRIPT
from theinference.curriculum.stages import load_stages
from theinference.output import html_page
from theinference.output.cases import comparison_table
from theinference.output.consoles import console
from theinference.output.formats import write
from theinference.output.heatmap import COLOURS, RAMP
from theinference.output.plain import case_text
from theinference.output.report import print_header, print_run, stage_block
from theinference.output.screen import draw, header
from theinference.output.terminal import renderer
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.compare import Tolerance, compare
from theinference.results.events import RunFinished, RunStarted, StageFinished
from theinference.results.json_form import comparison_json

# one worker runs this file: the runs its module fixtures grade serve several tests each
pytestmark = pytest.mark.xdist_group("test_report_reading")

SLUG = "build-prefill"
BUG = "every prompt token embedded at wpe[0]"


@pytest.fixture(scope="module")
def run(weights) -> RunResult:
    """build-prefill failing three cache cases the same way (a table and a map each)."""
    shown = prefill_position_zero(weights)
    cases = [shown] + [replace(shown, name=f"{shown.name}, again {i}") for i in (1, 2)]
    stage = StageResult(SLUG, "Implement prefill", Status.FAILED, cases, first_case=shown.name,
                        where=shown.where, bug_name=BUG, hint="Prompt token i gets wpe[i].",
                        diagnosed=True)
    return RunResult([stage], "synthetic", "0")


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def assert_unpadded(text: str, form: str) -> None:
    padded = [line for line in lines_of(text) if line != line.rstrip()]
    assert not padded, f"{form}: {len(padded)} lines end in spaces, e.g. {padded[0][-40:]!r}"
    longest = max(map(len, lines_of(text)))
    assert longest < 200, f"{form}: a line {longest} characters long"


def test_a_log_carries_no_padding_in_any_form(run, capsys, monkeypatch):
    """Would catch `theinference test > log` (and `| cat`, CI) writing error-map lines padded to
    10,000 characters or tables padded with trailing spaces, with or without COLUMNS, in the
    watch log form too, and in the text the pytest plugin reports."""
    monkeypatch.delenv("COLUMNS", raising=False)
    print_run(console(), run)
    assert_unpadded(capsys.readouterr().out, "piped")
    monkeypatch.setenv("COLUMNS", "100")
    print_run(console(), run)
    piped = capsys.readouterr().out
    assert_unpadded(piped, "piped with COLUMNS")
    assert "X first departs" in piped and max(map(len, lines_of(piped))) <= 100
    monkeypatch.delenv("COLUMNS")
    draw = renderer("course", "synthetic", [SLUG])("a save")
    for event in (RunStarted((SLUG,)), StageFinished(run.stages[0]), RunFinished(run)):
        draw(event)
    draw.close()
    watched = capsys.readouterr().out
    assert "error map" in watched
    assert_unpadded(watched, "watch log form")
    assert_unpadded(case_text(run.stages[0], run.stages[0].cases[0].name), "pytest text")


def plain_text(renderable, width: int = 100) -> str:
    out = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    out.print(renderable)
    return out.file.getvalue()


def test_a_noise_floor_of_zero_shows_no_multiple():
    """Would catch "float32 noise 0 ... yours differs 5.44e+11x that" on a one-token case,
    where the cached path is the recompute itself (docs/reference.md: no multiple shown)."""
    expected = np.linspace(-3, 3, 50).astype(np.float32)
    compared = compare("logits", expected + 2, expected, Tolerance(1e-3, 1e-2), logits=True)
    floorless = replace(compared, noise=0.0)
    (noise,) = [line for line in plain_text(comparison_table(floorless)).splitlines()
                if line.startswith("float32 noise")]
    assert "x that" not in noise and "e+" not in noise
    assert floorless.noise_multiple is None and comparison_json(floorless)["noise_multiple"] is None
    honest = replace(compared, noise=1e-5)
    assert "2e+05x that" in plain_text(comparison_table(honest))


def test_the_diagnosis_comes_first_and_failures_alike_share_one_table(run):
    """Would catch the suspected bug printed under every case's table (at the very bottom of a
    long stage), or one near-identical allclose table per case that fails the same way."""
    stage = run.stages[0]
    text = plain_text(stage_block(stage))
    body = text.index("cache after a six-token prompt  failed")
    assert text.index(f"suspected bug: {BUG}") < body and text.index("hint: Prompt") < body
    assert text.count("compared") == 1 and text.count("max abs diff") == 1
    assert "2 more failed the same way" in text
    for case in stage.cases[1:]:
        assert f"{case.name}  worst {case.worst:.3g}x" in text


def test_pytest_text_names_the_bug_first_and_the_diagnosis_once(run):
    """Would catch pytest's short summary line cut to "logits: 49892/..." where the suspected
    bug belongs, or the stage's hint repeated in every one of a stage's failures."""
    stage = run.stages[0]
    first, second = (case_text(stage, c.name, told) for c, told in
                     zip(stage.cases[:2], ("", f"'{stage.cases[0].name}'"), strict=True))
    assert first.splitlines()[0] == second.splitlines()[0] == f"suspected bug: {BUG}"
    assert first.count(BUG) == 1 and "hint: Prompt token i gets wpe[i]." in first
    assert "wpe[i]" not in second and stage.cases[0].name in second


@pytest.fixture(scope="module")
def one_bug(tmp_path_factory, weights) -> RunResult:
    course = make_course(tmp_path_factory.mktemp("one-bug") / "c", planted("attend-old-length"))
    return grade_course(course, weights, ["single-step-attention"])


def test_a_stage_with_one_bug_fits_a_100x45_terminal(one_bug):
    """Would catch a failing stage whose report scrolls its suspected bug off a 100x45 terminal:
    attend-old-length, graded end to end, every case failing the same way."""
    (stage,) = one_bug.stages
    assert stage.status == Status.FAILED and stage.bug_name
    out = Console(file=io.StringIO(), width=100, height=45, color_system=None, highlight=False)
    print_header(out, "/home/student/course", one_bug.weights_label, [stage.slug])
    print_run(out, one_bug)
    shown = out.file.getvalue().splitlines()
    assert len(shown) <= 45, "\n".join(shown)
    assert f"suspected bug: {stage.bug_name}" in "\n".join(shown[:12])


@pytest.fixture(scope="module", params=[("build-prefill", "prefill-position-zero"),
                                        ("full-decode-step", "decode-position-zero")],
                ids=["build-prefill", "full-decode-step"])
def one_bug_mapped(request, weights, answers) -> RunResult:
    """A stage with a map graded with one planted bug: its small cases end to end, each long
    case (left out to keep this test cheap) as a copy of the last failing case under its own
    name, as the full stage fails it, so the report has the full stage's length."""
    from dataclasses import replace as copied

    from theinference.grading.verify import Grounds, grade_text, quick

    slug, bug = request.param
    (stage,) = [s for s in load_stages() if s.slug == slug]
    run = grade_text(planted(bug), [quick(stage)], Grounds(weights, answers))
    (graded,) = run.stages
    left_out = [c.name for c in stage.cases if graded.case(c.name) is None]
    last = [c for c in graded.cases if c.status == Status.FAILED][-1]
    graded.cases += [copied(last, name=name) for name in left_out]
    return run


def test_a_stage_with_one_bug_and_its_map_fits_a_100x45_terminal(one_bug_mapped):
    """Would catch a report that scrolls its suspected bug off a 100x45 terminal where the
    stage draws an error map (the cache's twelve layers; the decode's logits), or one whose
    map falls off the bottom."""
    from dataclasses import replace as copied

    (stage,) = one_bug_mapped.stages
    assert stage.status == Status.FAILED and stage.bug_name
    out = Console(file=io.StringIO(), width=100, height=45, color_system=None, highlight=False)
    print_header(out, "/home/student/course", one_bug_mapped.weights_label, [stage.slug])
    # as a student's run in bubblewrap prints it: no note of what this machine's sandbox lacks
    # (graded here as the grader's own user, whose notes depend on the machine)
    print_run(out, copied(one_bug_mapped, notes=[]))
    shown = out.file.getvalue().splitlines()
    assert len(shown) <= 45, "\n".join(shown)
    assert f"suspected bug: {stage.bug_name}" in "\n".join(shown[:12])
    assert any(line.strip().startswith("X first departs at") for line in shown)


LEVEL_CELL = re.compile(r"\x1b\[([0-9;]+)m(.)\x1b\[0m")
LEGEND_IN = """import io, sys
from rich.console import Console
from theinference.output.heatmap import legend, palette
system = sys.argv[1] if sys.argv[1] != "none" else None
out = Console(file=io.StringIO(), width=120, color_system=system,
              force_terminal=system is not None, highlight=False)
out.print(legend(palette(out)))
print(out.file.getvalue(), end="")
"""


def test_the_map_legend_levels_differ_in_every_terminal():
    """Would catch two levels of the map's legend drawn alike (`<=100` and `<=1e3` shared one
    colour in a 16-colour terminal, and the within-tolerance green was grey there), or a map
    whose levels only colour tells apart: in true colour, 256 colours, 16 and none. (Each in
    its own process: rich keeps a style's codes for the first colour system it is drawn in.)"""
    for system in ("truecolor", "256", "standard", "none"):
        done = subprocess.run([sys.executable, "-c", LEGEND_IN, system], capture_output=True,
                              text=True)
        drawn = done.stdout
        assert done.returncode == 0, done.stderr
        chars = [c for c in drawn.split(":", 1)[1] if c in RAMP]
        assert chars == list(RAMP), (system, drawn)  # the levels' characters, in colour or not
        if system != "none":
            styles = [codes for codes, char in LEVEL_CELL.findall(drawn) if char in RAMP]
            assert len(set(styles)) == len(styles) == len(RAMP), (system, styles)


def lightness(colour: str) -> float:
    """CIE L* of a #rrggbb colour (0 black .. 100 white)."""
    channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return 116 * y ** (1 / 3) - 16 if y > 0.008856 else 903.3 * y


def test_the_html_map_is_legible_labelled_and_its_reds_apart(run, tmp_path):
    """Would catch the page's map drawn 45 px wide, a layer axis with no name, neighbouring
    levels past the tolerance too close in lightness to tell apart (and no character in the
    cells to tell them by), the report's text broken between a figure and its unit ("0.03" /
    "s"), or the page written readable by its owner only (0600)."""
    page = tmp_path / "run.html"
    write(run, "html", page)
    assert stat.S_IMODE(page.stat().st_mode) == 0o644
    text = page.read_text()
    svg = re.search(r"<svg[^>]*>.*?</svg>", text, re.S).group()
    cells = re.findall(r'<rect x="(\d+)" y="\d+" width="(\d+)"', svg)
    across = {int(x) for x, _ in cells if int(x) >= html_page.LABEL}
    assert max(across) + int(cells[-1][1]) - html_page.LABEL >= 200, "the map is too narrow"
    assert re.search(r'<text class="axis"[^>]*>[^<]*layer</text>', svg)
    assert re.search(r'<text class="axis"[^>]*>position[^<]*</text>', svg)
    shades = [lightness(c) for c in COLOURS[1:]]  # the levels past the tolerance, in order
    assert all(a - b >= 15 for a, b in zip(shades, shades[1:], strict=False)), shades
    marks = re.findall(r'font-weight="bold">(.)</text>', svg)
    assert set(RAMP) | {"X"} <= set(marks) and len(marks) >= len(cells), marks  # each cell
    report = re.search(r"<pre>(.*)</pre>", text, re.S).group(1)
    assert "0.0" in report and not re.search(r"\d[ \n]+s\b", report), "a figure split"


def test_a_stage_reached_through_an_earlier_stub_is_not_shown_its_message_as_its_own():
    """Would catch an untouched full-decode-step saying "not started: build-prefill: implement
    prefill" (the prerequisite's stub, reached first by its adapter) as if it were its own, in
    the log form, the watch screen and pytest's text."""
    message = "build-prefill: implement prefill in src/kvcache.py"
    case = CaseResult(name="one-token prompt", status=Status.TODO, message=message)
    stage = StageResult("full-decode-step", "Full-model cached decode step", Status.TODO, [case])
    run = RunResult([stage], "synthetic", "0")
    screen = io.StringIO()
    draw(Console(file=screen, width=200, color_system=None), header("c", "w", ""), run,
         ["full-decode-step"], True)
    shown = {"log": plain_text(stage_block(stage), 200), "screen": screen.getvalue(),
             "pytest": case_text(stage, case.name)}
    for form, text in shown.items():
        assert f"not started: {message}" not in text, form
        assert "build-prefill comes first (implement prefill in src/kvcache.py)" in text, form
    own = replace(case, message="full-decode-step: implement decode_step in src/kvcache.py")
    mine = replace(stage, cases=[own])
    assert f"not started: {own.message}" in plain_text(stage_block(mine), 200)


def test_the_course_words_fit_the_course_as_shipped():
    """Would catch guidance telling students to "then wire run_step_attention" when the
    template's adapters come wired, a case name spelled in Python shown to a TypeScript course
    (`attn_step`), or README and docs/reference.md disagreeing on how long the weights take
    to make (10 s against 4 s)."""
    stages = load_stages()
    for stage in stages:
        assert not re.search(r"\b[Ww]ire run_", stage.guidance), stage.slug
    python_names = [re.compile(rf"\b{re.escape(name)}\b") for name in TYPESCRIPT.names
                    if not name.isalpha() or not name.islower()]  # code, not words (raise)
    for case in (c for stage in stages for c in stage.cases):
        assert not any(name.search(case.name) for name in python_names), case.name
    root = Path(__file__).parent.parent
    said = [re.search(r"synthetic[^.]*?(?:made|generated) on first use,? \(?about (\d+) s",
                      (root / doc).read_text(), re.S) for doc in ("README.md", "docs/reference.md")]
    assert all(said) and said[0].group(1) == said[1].group(1), said


@pytest.fixture(scope="module")
def unknown_bug(weights, answers) -> StageResult:
    """single-step-attention with a bug the catalogue does not hold (the attention's output
    doubled): every case departs, the one-token case too."""
    from tests.bugs import REFERENCE
    from theinference.grading.verify import Grounds, grade_text, quick

    doubled = REFERENCE.read_text().replace(
        "    return attend(q, cache, w, layer)\n", "    return 2 * attend(q, cache, w, layer)\n")
    (stage,) = [s for s in load_stages() if s.slug == "single-step-attention"]
    return grade_text(doubled, [quick(stage)], Grounds(weights, answers)).stages[0]


def test_no_known_bug_says_what_the_numbers_show_not_bugs_that_cannot_apply(unknown_bug):
    """Would catch "no known bug matches" followed by the stage's three classic bugs (a cache
    bug cannot apply to a one-token case) in the terminal, JSON's hint or pytest's text,
    instead of which cases depart and how far."""
    stage = unknown_bug
    assert stage.status == Status.FAILED and stage.diagnosed and not stage.bug_name
    assert stage.hint.startswith("What the numbers show: every case departs, 'one token' too")
    assert "far past the tolerance: at worst" in stage.hint
    out = Console(file=io.StringIO(), width=100, color_system=None, highlight=False)
    out.print(stage_block(stage))
    said = [out.file.getvalue(), stage.hint, *(case_text(stage, c.name) for c in stage.cases)]
    for text in said:
        assert "classic bugs" not in text and "Wrong absolute position" not in text, text
    assert "no known bug matches" in said[0] and "What the numbers show" in said[0]


def test_the_numbers_say_where_along_each_axis_they_depart():
    """Would catch a description that misreads the map: layers 0-10 departing and 11 right (a
    shared cache assigned layer after layer), a departure from a step on, one layer alone."""
    from theinference.diagnosis.numbers import departing

    layers = {"name": "layer", "labels": [str(i) for i in range(12)]}
    assert departing(layers, [50.0] * 11 + [0.1]) == "layer 0–10 depart, 11 match"
    steps = {"name": "step", "labels": ["0", "1", "2", "3"]}
    assert departing(steps, [0.2, 0.9, 7.0, 9.0]) == "from step 2 on (step 0–1 match)"
    assert departing(layers, [0.1] * 3 + [4.0] + [0.1] * 8) == "layer 3 alone departs"
    assert departing(steps, [2.0] * 4) == "every step departs"
    merged = {"name": "position", "labels": ["0–9", "10–19", "20–29"]}
    assert departing(merged, [0.5, 3.0, 3.0]) == "from position 10–19 on (position 0–9 match)"


def test_a_blocked_stage_says_which_prerequisite_failed_in_plain_words():
    """Would catch "requires build-prefill, which is failed" (a status pasted into a sentence),
    or the reason missing from the terminal or the JSON; a chain says why the middle stage
    could not run."""
    import json

    from theinference.grading.prerequisites import first_blocker, skipped
    from theinference.output.formats import render

    stages = {s.slug: s for s in load_stages()}
    decode, sequence = stages["full-decode-step"], stages["per-step-identity"]
    words = {Status.FAILED: "failed", Status.ERROR: "raised an error",
             Status.TIMEOUT: "timed out"}
    for status, said in words.items():
        prefill = StageResult("build-prefill", "Implement prefill", status)
        assert first_blocker(decode, {"build-prefill": prefill}) == \
            f"requires build-prefill, which {said}"
    blocked = skipped(decode, first_blocker(decode, {"build-prefill": prefill}))
    chain = first_blocker(sequence, {"full-decode-step": blocked})
    assert chain == ("requires full-decode-step, which could not run (requires build-prefill, "
                     "which timed out)")
    run = RunResult([blocked], "synthetic", "0")
    out = Console(file=io.StringIO(), width=100, color_system=None, highlight=False)
    out.print(stage_block(blocked))
    assert "requires build-prefill, which timed out" in out.file.getvalue()
    assert json.loads(render(run, "json"))["stages"][0]["reason"] == blocked.reason
