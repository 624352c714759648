"""Limits and counts that make no sense are usage errors naming the option (exit 2), on every
command that takes one, before anything runs; so are such values in [grading]."""

import pytest
from typer.testing import CliRunner

from theinference.cli import app
from theinference.course.settings import SettingsError, parse_grading

runner = CliRunner()
NONSENSE = {
    # command line (with the nonsensical option last): the option the message must name
    "test --timeout -1": "--timeout",
    "test --timeout 0": "--timeout",
    "test --timeout nan": "--timeout",
    "test --timeout inf": "--timeout",
    "test --memory-gb 0": "--memory-gb",
    "test --memory-gb -0.5": "--memory-gb",
    "test --memory-gb 1e300": "--memory-gb",
    "test --output-kb 0": "--output-kb",
    "test --output-kb -64": "--output-kb",
    "test --seed -1": "--seed",
    "grade subs --out results --jobs 0": "--jobs",
    "grade subs --out results --jobs -2": "--jobs",
    "grade subs --out results --submission-timeout 0": "--submission-timeout",
    "grade subs --out results --seed -3": "--seed",
    "grade subs --out results --cpus 0": "--cpus",
    "grade subs --out results --memory 0": "--memory",
    "grade subs --out results --memory ten": "--memory",
    "grade subs --out results --memory 1e30": "--memory",
    "bench --new-tokens 0": "--new-tokens",
    "bench --repeats 0": "--repeats",
    "bench --lengths 16,0": "--lengths",
    "workflow matrix --shards 0": "--shards",
}


@pytest.mark.parametrize("line", NONSENSE)
def test_a_limit_at_or_below_zero_is_a_usage_error_naming_the_option(line):
    """Catches `--timeout -1` accepted (every case then "timed out"), and any other limit or
    count at or below zero, NaN or infinity, that runs instead of being refused."""
    result = runner.invoke(app, line.split(), env={"COLUMNS": "200"})
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 2, text
    assert NONSENSE[line] in text, text
    assert "Traceback" not in text


def test_the_seed_from_the_environment_is_checked_too():
    """Catches a negative or malformed THEINFERENCE_SEED slipping past the option's check."""
    for value in ("-4", "seven"):
        result = runner.invoke(app, ["test"], env={"THEINFERENCE_SEED": value, "COLUMNS": "200"})
        assert result.exit_code == 2 and "THEINFERENCE_SEED" in result.output, result.output


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -1])
def test_grading_limits_must_be_finite_and_above_zero(value):
    """Catches `timeout = nan` or `memory_gb = inf` in theinference.toml (TOML allows both)
    reaching the grader, where inf GiB cannot become a byte count."""
    for key in ("timeout", "memory_gb"):
        with pytest.raises(SettingsError, match=key):
            parse_grading({key: value})
