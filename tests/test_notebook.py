"""The course in a notebook, run by a real Jupyter kernel (nbclient): the course notebook of
`theinference init --notebook` filled in with the reference passes its checks; a planted bug
is named, with its error map as SVG, and fixing it in a cell regrades; a function that raises,
loops or returns garbage costs its check, never the kernel; the same notebook checks the same
from disk and from memory (Colab's case: no notebook file, no course directory); the inline
HTML renders in headless Chromium."""

import shutil
import subprocess

import nbformat
import pytest
from nbformat.v4 import new_code_cell
from typer.testing import CliRunner

from tests import notebook_helpers as nh
from tests.bugs import REFERENCE, planted
from theinference.cli import app

# one worker runs this file: the kernel `from_memory` starts serves every test that takes it
pytestmark = pytest.mark.xdist_group("test_notebook")

STAGE = "build-prefill"  # its cache check draws a map: layer down, position across
BUG = "prefill-position-zero"  # planted in `prefill`: the fix is one cell
FIX = "prefill"
NAMED = "every prompt token embedded at wpe[0]"  # the bug table's words for it
QUICK = "configure(quick=True)"  # the long cases left out: a partial check, in seconds
# the bug's check: its small cases, the cache's with its map among them (the diagnosis replays
# every bug of the stage on each failing case, the 300-token one included: seconds each)
SMALL = 'check("build-prefill", case=["short prompt", "token ids"])'
ONE_CASE = 'check("single-step-attention", case="two tokens")'
# a student's try-out in the kernel: the weights the checks grade with, never run by a check
EXPERIMENT = ("from src.gpt2 import embed, load_weights\nw = load_weights()\n"
              "layer_attn_incremental(embed([1, 2, 3], w), w, 0).shape")
HOSTILE = {  # a body of layer_attn_incremental -> its check, the status it gets
    "raise RuntimeError('a student bug')": (ONE_CASE, "ERROR"),
    # every case, but the stage stops at its first timeout
    "while True:\n        pass": ('check("single-step-attention", timeout=2, first_failure=True)',
                                   "TIMEOUT"),
    "return 'garbage'": (ONE_CASE, "FAILED"),
}


def with_fix_and_hostile(nb):
    """After the planted bug's check: the fixed `prefill` in a `%%check` cell, then each hostile
    layer_attn_incremental and a check of one case, then a cell showing the kernel lives."""
    _, named = nh.definitions(REFERENCE.read_text())
    nb.cells.append(new_code_cell(f"%%check {STAGE}\n{named[FIX]}"))
    nb.cells.append(new_code_cell(EXPERIMENT))
    for body, (check, _) in HOSTILE.items():
        nb.cells.append(new_code_cell(f"def layer_attn_incremental(X, w, layer):\n    {body}"))
        nb.cells.append(new_code_cell(check))
    nb.cells.append(new_code_cell("print('kernel alive', 6 * 7)"))
    return nb


def with_small_cases(nb):
    (cell,) = [c for c in nb.cells if c.source == f'check("{STAGE}")']
    cell.source = SMALL
    return nb


@pytest.fixture(scope="module")
def from_memory(weights, tmp_path_factory):
    """The course notebook built in memory, run in an empty folder."""
    nb = with_small_cases(nh.filled(nh.in_memory(), planted(BUG), through=STAGE, setup=QUICK))
    return nh.execute(with_fix_and_hostile(nb), tmp_path_factory.mktemp("empty"))


def test_a_planted_bug_is_named_with_its_map_and_a_fix_regrades(from_memory):
    """Would catch a check that grades stale code (the fix, in a %%check cell, not seen), a bug
    not named inline, or the error map missing from the check's output."""
    (_, first_html, _), (_, bug_html, bug_text), (_, fixed_html, _), *_ = nh.check_outputs(
        from_memory)
    assert nh.verdict(first_html) == "PASSED"  # the stage before, the reference's
    assert nh.verdict(bug_html) == "NOT PASSED"
    assert NAMED in bug_html and "first failing case" in bug_html
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in bug_html and 'class="first"' in bug_html
    assert "sandbox " in bug_html and "hint" in bug_html
    assert "NOT PASSED" in bug_text  # the text form, for a console
    assert nh.verdict(fixed_html) == "PASSED" and "<svg" not in fixed_html


def test_the_kernel_survives_a_function_that_raises_loops_or_returns_garbage(from_memory):
    """Would catch student code run in the kernel by a check (a loop would hang it, an
    exception end the cell), a hostile function graded as anything but its own failure, or
    `load_weights()` in a cell not reading the weights the checks grade with."""
    checks = nh.check_outputs(from_memory)[3:]
    assert len(checks) == len(HOSTILE)
    for (source, html, _), (status) in zip(checks, [s for _, s in HOSTILE.values()],
                                           strict=True):
        assert f"single-step-attention · Single-token cached attention · {status}" in html, (
            source, html)
    assert "a student bug" in checks[0][1]
    assert "TIMEOUT · 0/1 cases" in checks[1][1]  # first_failure: one timeout, not one a case
    last = from_memory.cells[-1].outputs
    assert last[0].text == "kernel alive 42\n"
    (tried,) = [c for c in from_memory.cells if c.source == EXPERIMENT]
    assert tried.outputs[0].data["text/plain"] == "(3, 768)"  # load_weights() in the kernel


@pytest.mark.slow  # a second kernel over the same checks: ~40 s
def test_the_same_notebook_from_disk_checks_the_same(from_memory, tmp_path):
    """Would catch a check that depends on where the notebook lives: the notebook `init
    --notebook` wrote, read back from disk, gives the same verdicts as the one built in memory."""
    result = CliRunner().invoke(app, ["init", str(tmp_path / "course"), "--notebook"])
    assert result.exit_code == 0, result.output
    on_disk = nbformat.read(tmp_path / "course" / "kvcache.ipynb", as_version=4)
    nbformat.validate(on_disk)
    nb = with_small_cases(nh.filled(on_disk, planted(BUG), through=STAGE, setup=QUICK))
    _, named = nh.definitions(REFERENCE.read_text())
    nb.cells += [new_code_cell(named[FIX]), new_code_cell(f'check("{STAGE}")')]
    disk = nh.check_outputs(nh.execute(nb, tmp_path / "course"))
    memory = nh.check_outputs(from_memory)[:3]
    assert [nh.verdict(h) for _, h, _ in disk] == [nh.verdict(h) for _, h, _ in memory]
    assert NAMED in disk[1][1]


def test_the_check_renders_in_chromium(from_memory, tmp_path):
    """Would catch inline HTML a browser cannot lay out (an unclosed tag, a broken SVG): the
    planted bug's check, as a page, rendered headless; its screenshot kept in tmp_path."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    html = nh.check_outputs(from_memory)[1][1]
    page = tmp_path / "check.html"
    page.write_text(f'<!doctype html><html lang="en"><meta charset="utf-8"><body>{html}</body>')
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1400"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    shot = subprocess.run([*flags, f"--screenshot={tmp_path / 'check.png'}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and shot.returncode == 0, shot.stderr[-2000:]
    assert "<svg" in dom.stdout and "first failing case" in dom.stdout
    png = (tmp_path / "check.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


@pytest.mark.slow
def test_the_reference_passes_every_check_of_the_course_notebook(weights, tmp_path):
    """Would catch a stage whose stubs, guidance or check cell the notebook gets wrong, or
    a check that grades other code than the cells': every check of the whole course notebook,
    filled in with the reference (quick: the long cases left out), passes."""
    nb = nh.filled(nh.in_memory(), REFERENCE.read_text(), through="prefix-caching",
                   setup="configure(quick=True)")  # the last cell, check(), grades them again
    checks = nh.check_outputs(nh.execute(nb, tmp_path))
    assert len(checks) == 6  # a check per stage
    for source, html, _ in checks:
        assert nh.verdict(html) == "PASSED", (source, html[-3000:])
