"""The command line through Typer's CliRunner: exit codes, messages, never a traceback."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_course
from theinference import exits
from theinference.cli import app

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def test_help_lists_the_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("init", "test", "stages", "hint"):
        assert command in result.output


def test_init_writes_the_template_and_refuses_to_overwrite(tmp_path):
    target = tmp_path / "course"
    first = invoke("init", str(target))
    assert first.exit_code == 0
    for rel in ("src/gpt2.py", "src/kvcache.py", "tests/adapters.py", "theinference.toml"):
        assert (target / rel).is_file()
    (target / "src" / "kvcache.py").write_text("# my work\n")
    second = invoke("init", str(target))
    assert second.exit_code == exits.COURSE
    assert "not overwriting" in second.output
    assert (target / "src" / "kvcache.py").read_text() == "# my work\n"


def test_fresh_course_is_todo_everywhere_and_exits_non_zero(template_course):
    result = invoke("test", "--course-dir", str(template_course))
    assert result.exit_code == exits.NOT_PASSED
    assert result.output.count("TODO") == 6
    assert "synthetic (" in result.output  # the report names the weights and their hash


def test_selected_stages_run_alone(reference_course):
    result = invoke("test", "-C", str(reference_course), "--stage", "single-step-attention")
    assert result.exit_code == exits.OK
    assert "single-step-attention" in result.output and "build-prefill  " not in result.output


def test_unknown_stage_suggests_the_nearest(template_course):
    result = invoke("test", "-C", str(template_course), "--stage", "full-decode")
    assert result.exit_code == exits.USAGE
    assert "Did you mean 'full-decode-step'?" in result.output


def test_not_a_course_directory(tmp_path):
    missing = invoke("test", "-C", str(tmp_path / "nope"))
    assert missing.exit_code == exits.COURSE and "does not exist" in missing.output
    empty = invoke("test", "-C", str(tmp_path))
    assert empty.exit_code == exits.COURSE and "theinference init" in empty.output


def test_malformed_settings_file(template_course):
    (template_course / "theinference.toml").write_text("weights = [unclosed\n")
    result = invoke("test", "-C", str(template_course))
    assert result.exit_code == exits.COURSE and "not valid TOML" in result.output


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("missing.safetensors", "does not exist"),
        ("junk.safetensors", "not a safetensors file"),
    ],
)
def test_bad_weights_option(template_course, spec, expected):
    (template_course / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00nope")
    result = invoke("test", "-C", str(template_course), "--weights", spec)
    assert result.exit_code == exits.WEIGHTS and expected in result.output


def test_weights_from_the_settings_file_are_resolved_in_the_course(template_course):
    (template_course / "theinference.toml").write_text('weights = "models/none.safetensors"\n')
    result = invoke("test", "-C", str(template_course))
    assert result.exit_code == exits.WEIGHTS
    assert str(Path(template_course, "models", "none.safetensors")) in result.output


def test_stages_and_hint(tmp_path):
    listing = invoke("stages")
    assert listing.exit_code == 0
    order = [
        listing.output.index(s)
        for s in ("single-step-attention", "build-prefill", "full-decode-step")
    ]
    assert order == sorted(order)
    hint = invoke("hint", "single-step-attention")
    assert hint.exit_code == 0 and "oldLen + 1" in hint.output
    assert invoke("hint", "nope").exit_code == exits.USAGE


def test_a_failing_stage_shows_the_allclose_table(tmp_path):
    from tests.bugs import BUGS

    bug = next(b for b in BUGS if b.id == "missing-ln-f")
    course = make_course(tmp_path / "c", bug.planted())
    result = invoke("test", "-C", str(course), "-s", "build-prefill")
    assert result.exit_code == exits.NOT_PASSED
    for label in (
        "mismatched",
        "max abs diff",
        "max rel diff",
        "argmax",
        "tolerance",
        "atol 0.001, rtol 0.01",
    ):
        assert label in result.output
