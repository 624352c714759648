"""The student's text is inert wherever it is written: escape sequences shown, never acted on,
in the terminal report and the watch screen; junit.xml well-formed whatever the student
printed; Gradescope's markdown unable to render the student's headings, HTML or images; the
class report and the gradebook unable to run the student's markup or formulas."""

import csv
import io
import json
import xml.etree.ElementTree as ET

import pyte
import pytest
from markdown_it import MarkdownIt
from rich.console import Console

from tests.test_hostile import grade, submission
from theinference.classroom.class_report import student_body
from theinference.classroom.gradebook import gradebook_text
from theinference.course.settings import Grading
from theinference.output import report, screen
from theinference.output.formats import render
from theinference.output.gradescope import gradescope_results
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.json_form import read_run
from theinference.results.submission import Record
from theinference.results.text import (
    csv_cell,
    html_text,
    markdown_fence,
    markdown_text,
    terminal_text,
    xml_text,
)

# erase the line above and the screen, move up, draw a green "passed", set the window title
FORGED = "\x1b[1A\x1b[2K\x1b[2J\x1b[H\x1b[32m✓ single-step-attention  PASSED\x1b[0m\x1b]0;t\x07"
MARKDOWN = "```\n# 7 of 7 points\n<b>bold</b> <img src=https://x.test/a.png>\n![i](https://x.test/b.png)"
CONTROLS = "".join(map(chr, [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, 0x85, 0x9B]))
STUDENT = FORGED + "\n" + MARKDOWN + "\n" + CONTROLS + "\ud800\u202e"


def hostile_run() -> RunResult:
    case = CaseResult(
        name="two tokens",
        status=Status.ERROR,
        message="RuntimeError: " + STUDENT,
        traceback="Traceback (your code, most recent call last):\n  " + STUDENT,
        stdout=STUDENT,
        stderr=STUDENT,
    )
    stage = StageResult(  # the case shown in full, as the grader's diagnosis names it
        "single-step-attention", "Single-step attention", Status.ERROR, [case], first_case=case.name
    )
    return RunResult(stages=[stage], weights_label="synthetic (abc)", weights_sha256="abc")


def on_a_screen(draw) -> pyte.Screen:
    """What a 120x200 terminal shows after `draw(console)` writes to it, colours and all."""
    buffer = io.StringIO()
    out = Console(file=buffer, force_terminal=True, color_system="truecolor", width=120)
    draw(out)
    shown = pyte.Screen(120, 200)
    pyte.Stream(shown).feed(buffer.getvalue().replace("\n", "\r\n"))
    return shown


def assert_nothing_took_effect(shown: pyte.Screen) -> None:
    assert shown.title == "", "the student's code set the window title"
    first = next(i for i, line in enumerate(shown.display) if "single-step-attention" in line)
    assert "ERROR" in shown.display[first], "the real verdict's line was overwritten"
    for y, line in enumerate(shown.display):  # the forged "passed" line is never drawn green
        if "PASSED" in line and "single-step-attention" in line and y != first:
            x = line.index("PASSED")
            assert shown.buffer[y][x].fg != "green", line
    text = "\n".join(shown.display)
    assert "\\x1b[2K" in text and "\\x1b[1A" in text, "the escapes are not shown"
    assert "t\\x07" in text and "\\x9b" in text and "\\u202e" in text


def test_the_terminal_report_shows_escapes_without_obeying_them():
    """Catches student escapes reaching the terminal raw: erased lines, a green "passed"
    drawn above the real verdict, a changed window title."""
    run = hostile_run()
    assert_nothing_took_effect(on_a_screen(lambda out: report.print_run(out, run)))


def test_the_watch_screen_shows_escapes_without_obeying_them():
    """The same for watch mode's screen (its own drawing of a run)."""
    run = hostile_run()

    def draw(out):
        top = screen.header("course", "synthetic (abc)", "src/\x1b[2Jkvcache.py")
        screen.draw(out, top, run, ["single-step-attention"], keys=True)

    shown = on_a_screen(draw)
    assert_nothing_took_effect(shown)
    assert "src/\\x1b[2Jkvcache.py" in "\n".join(shown.display)


def test_junit_is_well_formed_xml_whatever_the_student_printed():
    """Catches control characters that make junit.xml unreadable to a strict XML parser."""
    text = render(hostile_run(), "junit")
    root = ET.fromstring(text.encode())  # expat: refuses any character XML 1.0 forbids
    out = root.find(".//system-out").text
    assert "\\x1b[2K" in out and "\\x00" in out and "<b>bold</b>" in out


def test_json_keeps_the_students_text_raw_but_encodable():
    """Catches JSON that drops the student's output, or a lone surrogate that no UTF-8 reader
    accepts."""
    text = render(hostile_run(), "json")
    text.encode("utf-8")
    case = json.loads(text)["stages"][0]["cases"][0]
    assert case["stdout"].startswith(FORGED) and "\ud800" not in case["stdout"]


def rendered_gradescope(run: RunResult) -> tuple[dict, list[str]]:
    """results.json and each of its markdown outputs rendered as Gradescope would (HTML on)."""
    data = gradescope_results(read_run(render(run, "json")), {}, Grading())
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    return data, [md.render(t["output"]) for t in [data, *data["tests"]]]


def test_gradescope_markdown_cannot_render_the_students_markup():
    """Catches a ``` in the student's text closing the fence, so that its heading ("7 of 7
    points"), HTML and remote images render as the report's own."""
    _, pages = rendered_gradescope(hostile_run())
    page = "\n".join(pages)
    assert "<img" not in page and "<b>" not in page
    assert "<h1>" not in page and "7 of 7 points</h" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "# 7 of 7 points" in page  # shown, as text


def test_a_fence_is_longer_than_any_backtick_run_inside():
    """Catches a fence that a run of backticks in the text can close."""
    text = "a ```` b\n`````\nc"
    block = markdown_fence(text)
    assert block.startswith("``````\n") and block.endswith("\n``````")
    html = MarkdownIt("commonmark").render(block + "\n\n# after")
    assert html.count("<pre>") == 1 and "<h1>after</h1>" in html


def test_inline_markdown_renders_as_the_text():
    """Catches inline student text that starts a heading, list, link, image, table cell or
    emphasis, or passes HTML through."""
    text = "# h\n- item\n1. one\n*em* _u_ [l](https://x.test) ![i](https://x.test/i.png)"
    text += " a|b <i>x</i> &amp;"
    html = MarkdownIt("commonmark", {"html": True}).render(markdown_text(text))
    for tag in ("<h1>", "<li>", "<em>", "<a ", "<img", "<i>"):
        assert tag not in html, tag
    assert "![i](https://x.test/i.png)" in html and "&lt;i&gt;x&lt;/i&gt;" in html
    assert "&amp;amp;" in html  # the student's "&amp;" shown as typed


def test_the_class_report_and_gradebook_keep_a_hostile_id_as_text():
    """Catches a submission named like markup or a formula that runs in the class report or
    in the spreadsheet the gradebook opens in."""
    sid = "=HYPERLINK(\"http://x.test\")<script>x</script>\x1b[2J"
    record = Record(sid, "rejected", "refused: <img src=x>\x07", max_score=1.0,
                    content_sha256="0")
    body = student_body(record)
    assert "<script>" not in body and "<img" not in body and "\x1b" not in body
    assert "\\x1b[2J" in body and "\\x07" in body
    (row,) = list(csv.DictReader(io.StringIO(gradebook_text([record]))))
    assert row["student"].startswith("'=") and "\x1b" not in row["student"]
    assert "\x07" not in row["message"]


@pytest.mark.parametrize("clean", [terminal_text, xml_text, html_text, csv_cell])
def test_no_control_survives_but_newlines_and_tabs(clean):
    """Catches a control character any of the cleaners lets through."""
    out = clean("a\tb\r\nc\n" + CONTROLS + "\ud800\ufffe")
    assert "a\tb\nc\n" in out
    assert not any(ord(ch) < 0x20 and ch not in "\t\n" or 0x7F <= ord(ch) <= 0x9F for ch in out)
    assert "\ud800" not in out and "\ufffe" not in out


PRINTS_ESCAPES = """print("\\x1b[1A\\x1b[2K\\x1b[32mPASSED\\x1b[0m\\x07\\x00")
    sys.stderr.write("```\\n# 7 of 7 points\\n\\x1b[2J")
    raise RuntimeError("\\x1b[2K\\x1b[32mall stages passed ```<img src=https://x.test/a.png>")"""


def test_a_submission_that_prints_escapes_gets_inert_reports(tmp_path):
    """The attack end to end through the command line: the student's output and exception
    carry escapes, control characters and a fence. The terminal log holds no escape at all,
    junit.xml parses, Gradescope's markdown renders no image, the JSON keeps the raw text."""
    course = submission(tmp_path, PRINTS_ESCAPES)
    junit, scope = tmp_path / "junit.xml", tmp_path / "gradescope.json"
    case, output, _ = grade(course, tmp_path, "--junit", str(junit), "--gradescope", str(scope))
    assert case["status"] == "error"
    assert "\x1b" not in output and "\x07" not in output and "\x00" not in output
    assert "\\x1b[2K" in output
    ET.parse(junit)
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    pages = [md.render(t["output"]) for t in json.loads(scope.read_text())["tests"]]
    assert not any("<img" in page or "<h1>" in page for page in pages)
    assert "\x1b[1A" in case["stdout"]


def test_the_class_summary_shows_a_hostile_id_as_text(capsys, monkeypatch):
    """Catches a student id (a file name) read as rich markup or passed raw to the terminal
    in the instructor's summary table."""
    from theinference.output.class_screens import print_class_summary

    record = Record("[bold red]x[/]\x1b[2J", "rejected",
                    "refused: [link=https://x.test]y[/link]", max_score=1.0)
    monkeypatch.setenv("COLUMNS", "200")  # one line per row: nothing wrapped
    print_class_summary([record], 0, "gradebook.csv")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "[bold red]x[/]\\x1b[2J" in err
    assert "[link=https://x.test]" in err
