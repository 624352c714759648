"""Similar code, the template subtracted (classroom/similarity.py, copydetect): a copy with
renamed variables is flagged, independent solutions on the same template are not, in Python
and TypeScript; the class report shows the flagged pair side by side, escaped, and renders
in headless Chromium."""

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import classroom_helpers as ch
from tests.test_class_grade import render
from theinference.classroom.report_sections import similarity_section
from theinference.classroom.similarity import similar_pairs
from theinference.cli import app
from theinference.course.languages import PYTHON, TYPESCRIPT
from theinference.results.submission import Record

# one worker runs this file: the class graded once (`class_report`) serves every test here
pytestmark = pytest.mark.xdist_group("test_similarity")

runner = CliRunner()
SOLUTIONS = Path(__file__).parent / "solutions"
TS_REFERENCE = Path(__file__).parent / "solutions_ts" / "reference_kvcache.ts"
RENAMES_PY = {"cache": "store", "keys": "ks", "values": "vs", "heads": "nh", "scores": "att",
              "layer": "li", "prompt_ids": "toks", "append_kv": "push_rows", "attend": "look",
              "prefill_layer": "fill_block", "common_prefix": "shared_len", "out": "rows"}
RENAMES_TS = {"cache": "store", "heads": "nh", "layer": "li", "promptIds": "toks",
              "appendKv": "pushRows", "attendRows": "lookRows", "prefillLayer": "fillBlock",
              "commonPrefix": "sharedLen", "copyPrefix": "cloneRows", "scores": "att"}


def renamed(text: str, renames: dict[str, str]) -> str:
    """The same code with its identifiers renamed (whole words), as a copier would."""
    for old, new in renames.items():
        text = re.sub(rf"\b{old}\b", new, text)
    return text


def record(sid: str, code: dict[str, str]) -> Record:
    return Record(sid, "graded", code=code)


def kvcache(text: str) -> dict[str, str]:
    return {"src/kvcache.py": text}


def pairs_of(records: list[Record]) -> list[tuple[str, str]]:
    return [(p.a, p.b) for p in similar_pairs(records)]


def test_a_renamed_copy_is_flagged_and_independent_solutions_are_not():
    """Would catch the template counted as shared code (every pair flagged), renaming hiding
    a copy, or independent solutions to the same stages flagged for their common shape."""
    ref = ch.reference()
    records = [
        record("ann", kvcache(ref)),
        record("bob", kvcache(renamed(ref, RENAMES_PY))),
        record("cyd", kvcache((SOLUTIONS / "independent_kvcache.py").read_text())),
        record("dee", kvcache((SOLUTIONS / "preallocated_kvcache.py").read_text())),
        record("eve", kvcache((PYTHON.template / "src" / "kvcache.py").read_text())),
        record("fay", kvcache((PYTHON.template / "src" / "kvcache.py").read_text())),
    ]
    (pair,) = similar_pairs(records)
    assert (pair.a, pair.b) == ("ann", "bob") and pair.similarity > 0.9
    assert pair.fragments[0].path == "src/kvcache.py" and "<mark>" in pair.fragments[0].left


def test_typescript_copies_are_flagged_and_the_template_is_not():
    """Would catch TypeScript submissions left out, or the TypeScript template's stubs and
    adapters counted as shared code."""
    ref = TS_REFERENCE.read_text()
    template = {path: (TYPESCRIPT.template / path).read_text()
                for path in ("src/kvcache.ts", "tests/adapters.ts")}
    records = [
        record("ann", {**template, "src/kvcache.ts": ref}),
        record("bob", {**template, "src/kvcache.ts": renamed(ref, RENAMES_TS)}),
        record("cyd", template),
        record("dee", dict(template)),
        record("eve", kvcache(ch.reference())),  # a Python solution is never compared with TS
    ]
    assert pairs_of(records) == [("ann", "bob")]


def test_shared_fragments_are_escaped():
    """Would catch student text reaching the report as HTML (a copied `</pre><script>`)."""
    hostile = ch.reference() + '\n\nNOTE = "</pre><script>alert(1)</script>"\n'
    (pair,) = similar_pairs([record("a", kvcache(hostile)), record("b", kvcache(hostile))])
    html = similarity_section([pair], 0.5)
    assert "<script>" not in html and "&lt;script&gt;" in html


@pytest.fixture(scope="module")
def class_report(tmp_path_factory, weights) -> tuple[Path, Path]:
    """A small class graded on one tiny case: the reference, a renamed copy of it (loose
    files), and two independent solutions; then its report."""
    root = tmp_path_factory.mktemp("similar")
    subs = root / "submissions"
    subs.mkdir()
    ref = ch.reference()
    ch.add(subs, "ann", ref)
    ch.add(subs, "bob", renamed(ref, RENAMES_PY), "loose")
    ch.add(subs, "cyd", ch.independent(), "zip")
    ch.add(subs, "dee", (SOLUTIONS / "preallocated_kvcache.py").read_text())
    course = ch.make_course(root / "instructor")
    graded = runner.invoke(app, ["grade", str(subs), "--out", str(root / "results"), "-C",
                                 str(course), "-s", "single-step-attention", "--case",
                                 "one token repeated", "--jobs", "2"])
    assert graded.exit_code == 0, graded.output
    html = root / "class.html"
    result = runner.invoke(app, ["report", str(root / "results"), "--html", str(html)])
    assert result.exit_code == 0, result.output
    return root, html


def test_the_class_report_shows_the_pair_and_renders_in_chromium(class_report, tmp_path):
    """Would catch the pair missing from the report, an independent pair listed, or a
    similarity section a real browser cannot render."""
    _, html = class_report
    text = html.read_text()
    section = text[text.index("<section id=similarity>"):]
    section = section[: section.index("</section>")]
    assert section.count("<h3 class=pair>") == 1 and "ann and bob" in section
    assert "cyd" not in section and "dee" not in section
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    dom, png = render(chromium, html, tmp_path)
    assert "Similar code (template subtracted)" in dom and "ann and bob" in dom
    assert "<mark>" in dom and png[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_can_leave_similarity_out(class_report):
    """Would catch --no-similarity still comparing code."""
    root, _ = class_report
    html = root / "plain.html"
    result = runner.invoke(app, ["report", str(root / "results"), "--html", str(html),
                                 "--no-similarity"])
    assert result.exit_code == 0 and "id=similarity" not in html.read_text()
