"""The hidden cases' seed is resolved by one function that carries where it came from."""

import json

import pytest

from theinference.grading.provenance import seed_label
from theinference.grading.seed import NO_SEED, Seed, SeedError, resolve_seed


def test_each_source_is_named_as_it_was_given(monkeypatch, tmp_path):
    """Would catch a source guessed back wrongly (an option taken for the environment, a fixed
    setting for an option): the provenance would tell a regrade the wrong reason."""
    monkeypatch.setenv("THEINFERENCE_SEED", "11")
    (tmp_path / "submission_metadata.json").write_text(json.dumps({"id": 424242}))
    assert resolve_seed(11) == Seed(11, "option")  # the same number as the environment's
    assert resolve_seed(None) == Seed(11, "env")
    assert resolve_seed(None, 7) == Seed(7, "fixed")
    assert resolve_seed(None, "none") == NO_SEED
    assert resolve_seed(None, "submission", submission_root=tmp_path) == Seed(424242, "submission")
    assert resolve_seed(None, "submission", submission_root=tmp_path / "absent").value is None
    monkeypatch.delenv("THEINFERENCE_SEED")
    assert resolve_seed(None) == NO_SEED


@pytest.mark.parametrize("text", ["-4", "seven", "1.5"])
def test_a_malformed_environment_seed_is_refused(monkeypatch, text):
    """Would catch THEINFERENCE_SEED=seven grading with no hidden cases, silently."""
    monkeypatch.setenv("THEINFERENCE_SEED", text)
    with pytest.raises(SeedError, match="THEINFERENCE_SEED"):
        resolve_seed(None)


def test_the_label_hides_the_seed_and_keeps_its_source():
    """Would catch the seed itself written into results, or two seeds labelled alike."""
    label = seed_label(Seed(7, "fixed"))
    assert label.startswith("fixed ") and label != "fixed 7"
    assert seed_label(Seed(8, "fixed")) != label
    assert seed_label(NO_SEED) == "none"
