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
    from tests.bugs import planted

    course = make_course(tmp_path / "c", planted("missing-ln-f"))
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


def test_verify_prints_the_margin_table(weights):
    result = invoke(
        "verify",
        "--quick",
        "--bug",
        "missing-ln-f",
        "--bug",
        "decode-position-one",
        "--stage",
        "build-prefill",
        "--stage",
        "full-decode-step",
    )
    assert result.exit_code == exits.OK, result.output
    for text in (
        "reference",
        "missing-ln-f",
        "decode-position-one",
        "position-one",
        "largest",
        "smallest",
        "as expected",
    ):
        assert text in result.output
    assert "WRONG" not in result.output


def test_verify_flags_a_bug_the_grader_cannot_catch(tmp_path):
    from tests.bugs import SOLUTIONS

    (tmp_path / "reference_kvcache.py").write_text((SOLUTIONS / "reference_kvcache.py").read_text())
    (tmp_path / "bugs.toml").write_text(
        'format = 1\n[[bugs]]\nid = "harmless"\nstage = "single-step-attention"\n'
        'old = "def embed_token(token_id, position, w):"\n'
        'new = "def embed_token(token_id, position, w):  # a comment changes nothing"\n'
    )
    result = invoke(
        "verify", "--quick", "--solutions", str(tmp_path), "-s", "single-step-attention"
    )
    assert result.exit_code == exits.NOT_PASSED and "WRONG" in result.output


def test_bench_times_cached_against_recompute(reference_course, tmp_path):
    import json

    out = tmp_path / "bench.json"
    result = invoke(
        "bench",
        "-C",
        str(reference_course),
        "--lengths",
        "8,96",
        "--new-tokens",
        "6",
        "--repeats",
        "2",
        "--json",
        str(out),
    )
    assert result.exit_code == exits.OK, result.output
    assert "faster with the cache" in result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["prompt_length"] for r in rows] == [8, 96]
    # timings on a shared machine are noisy: the figures exist and are sane, not their sizes
    assert all(r["cached_ms_per_token"]["median"] >= 0 for r in rows)
    assert all(r["recompute_ms_per_token"]["median"] > 0 for r in rows)
    assert all(r["oracle_cached_ms_per_token"] > 0 for r in rows)


def test_bench_on_an_unfinished_course_says_what_to_finish(template_course):
    result = invoke("bench", "-C", str(template_course), "--lengths", "8", "--repeats", "1")
    assert result.exit_code == exits.NOT_PASSED and "generate-loop" in result.output


def test_reports_carry_the_float32_noise_floor(reference_course, tmp_path):
    import json

    out = tmp_path / "r.json"
    result = invoke("test", "-C", str(reference_course), "-s", "build-prefill", "--json", str(out))
    assert result.exit_code == exits.OK and "the float32 noise" in result.output
    cases = json.loads(out.read_text())["stages"][0]["cases"]
    logits = [c["comparisons"][0] for c in cases if c["name"] == "short prompt"][0]
    assert 0 < logits["noise_floor"] < 1e-3  # drift far inside the tolerance
    assert logits["noise_multiple"] < 50  # a correct answer sits near the noise, not above it


def test_verify_without_solutions_names_the_option(tmp_path, weights):
    """Would catch: `verify` from an installed package (no tests/solutions beside it) failing
    with a traceback or an unexplained path instead of naming --solutions."""
    result = invoke("verify", "--solutions", str(tmp_path / "absent"), "-s", "build-prefill")
    assert result.exit_code == exits.USAGE
    assert "--solutions" in result.output and "does not ship" in result.output


def test_a_run_prints_nothing_itself(template_course, weights, capsys):
    """Would catch: session.run printing (the terminal must be a listener, so watch mode and
    machine formats decide what is drawn)."""
    from theinference.grading.policy import RunPolicy
    from theinference.grading.session import LimitRequest, RunRequest, prepare, run

    request = RunRequest(stages=("single-step-attention",), policy=RunPolicy(),
                         limits=LimitRequest(timeout=30))
    session = prepare(template_course, request)
    result = run(session)
    assert capsys.readouterr().out == "" and result.stages[0].status.value == "todo"
    assert result.environment["numpy"] and result.notes == []  # complete when returned


def all_commands(group, path=()):
    """(command path, command) for every command and group of the CLI."""
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from all_commands(command, (*path, name))


def test_every_help_text_is_shown_as_written():
    """Catches help text that loses words in `--help` (rich markup ate "[grading]" in
    "default: [grading] stages, all"): every command's and option's own words appear."""
    import typer

    from theinference.cli import app

    def squeezed(text: str) -> str:
        return "".join(text.split())  # wrapping may move line breaks, never words

    commands = list(all_commands(typer.main.get_command(app)))
    assert len(commands) > 15, commands  # every command and group was reached
    for path, command in commands:
        shown = squeezed(runner.invoke(app, [*path, "--help"], terminal_width=100).output)
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for text in texts:
            assert squeezed(text) in shown, (path, text)


def test_a_command_starts_without_pydantic(template_course):
    """Catches a typer that parses options through pydantic (0.29 and later: pyproject.toml
    keeps below it): its import and its adapters cost 0.2 to 0.3 s at every command's start,
    a sixth of a single-step save."""
    import subprocess
    import sys

    code = (
        "import sys; from typer.testing import CliRunner; from theinference.cli import app; "
        f"CliRunner().invoke(app, ['test', '-C', {str(template_course)!r}, '--stage', 'nope']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
