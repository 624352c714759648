"""theinference.toml against its schema: a typo or a wrong kind is refused, naming the nearest
valid key, through the real CLI and never as a traceback."""

import pytest
from typer.testing import CliRunner

from theinference import exits
from theinference.cli import app
from theinference.course.settings import SettingsError, check_stage_names, parse_settings

runner = CliRunner()


@pytest.mark.parametrize(
    "data, words",
    [
        ({"wieghts": "gpt2"}, ["'wieghts'", "did you mean 'weights'?"]),
        ({"grader": {"timeout": 5}}, ["'grader'", "did you mean 'grading'?"]),
        ({"grading": {"timout": 5}}, ["'timout'", "did you mean 'timeout'?"]),
        ({"grading": {"visibilty": "hidden"}}, ["did you mean 'visibility'?"]),
        ({"grading": {"visibility": "sometimes"}}, ["visibility must be one of"]),
        ({"grading": {"scores": {"build-prefill": -1}}}, ["scores.build-prefill"]),
        ({"grading": {"partial_credit": "yes"}}, ["partial_credit must be true or false"]),
        ({"grading": {"seed": "random"}}, ["seed must be one of"]),
        ({"grading": {"output_kb": 1.5}}, ["output_kb must be a whole number"]),
        ({"language": "rust"}, ["'language' must be one of python, ts"]),
    ],
)
def test_bad_settings_are_refused_with_the_nearest_key(data, words):
    """Would catch a typo or a bad value silently ignored (grading against the defaults)."""
    with pytest.raises(SettingsError) as caught:
        parse_settings(data)
    for word in words:
        assert word in str(caught.value)


def test_good_settings_are_read():
    """Would catch a valid setting dropped or misread on its way into Grading."""
    s = parse_settings({
        "weights": "gpt2",
        "language": "ts",
        "grading": {
            "stages": ["build-prefill"],
            "scores": {"build-prefill": 3},
            "stage_visibility": {"build-prefill": "after_due_date"},
            "partial_credit": True,
            "seed": 7,
            "timeout": 5,
            "memory_gb": 2,
            "output_kb": 16,
        },
    })
    g = s.grading
    assert (s.weights, s.language.name, g.stages, g.seed, g.timeout) == (
        "gpt2", "ts", ("build-prefill",), 7, 5.0)
    assert g.points("build-prefill", 1) == 3.0 and g.points("generate-loop", 1) == 1.0
    assert g.visibility_of("build-prefill") == "after_due_date"
    assert g.visibility_of("generate-loop") == "visible"


def test_an_unknown_stage_in_grading_is_refused():
    """Would catch points given to a misspelled stage and lost without a word."""
    g = parse_settings({"grading": {"scores": {"build-prefil": 2}}}).grading
    with pytest.raises(SettingsError, match="did you mean 'build-prefill'"):
        check_stage_names(g, ["build-prefill", "generate-loop"])


def test_the_cli_refuses_a_misspelled_key(template_course):
    """Would catch `theinference test` grading with `wieghts` ignored, or a traceback."""
    (template_course / "theinference.toml").write_text('wieghts = "gpt2"\n')
    result = runner.invoke(app, ["test", "-C", str(template_course)])
    assert result.exit_code == exits.COURSE
    assert "did you mean 'weights'?" in result.output
    assert "Traceback" not in result.output
