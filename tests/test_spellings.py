"""The catalogued bugs as students also spell them (tests/solutions/spellings.toml): by
assignment and by append, in a class and in a dict, per head and batched. Each is graded like
a planted bug of bugs.toml (what `theinference verify --quick` runs): its stage fails and the
grader names the catalogued bug, not another, and not "no known bug"."""

import pytest

from tests.bugs import BUGS, REFERENCE, SOLUTIONS
from tests.test_grading import assert_localised_cases_carry_their_map
from theinference.diagnosis.bugs import bug_table
from theinference.grading.verify import load_bugs

SPELLINGS = load_bugs(SOLUTIONS / "spellings.toml")


def test_every_spelling_is_a_new_text_of_a_catalogued_bug():
    """Catches a spelling that names no catalogued bug, repeats a planted bug's text (so it
    tests nothing new), or whose edit no longer applies to the reference."""
    planted = {b.planted(REFERENCE.read_text()) for b in BUGS}
    for spelling in SPELLINGS:
        assert spelling.fingerprint in bug_table(), spelling.id
        assert spelling.planted(REFERENCE.read_text()) not in planted, spelling.id
    assert len({s.id for s in SPELLINGS} | {b.id for b in BUGS}) == len(SPELLINGS) + len(BUGS)


@pytest.mark.parametrize("spelling", SPELLINGS, ids=[s.id for s in SPELLINGS])
def test_a_spelling_fails_its_stage_and_is_named(spelling, weights, answers):
    """Catches a spelling of a catalogued bug the diagnosis does not recognise ("no known bug
    matches"), or names as another bug."""
    from theinference.curriculum.stages import load_stages
    from theinference.grading.verify import Grounds, quick, verify_bug
    from theinference.results.events import StageFinished

    (stage,) = [s for s in load_stages() if s.slug == spelling.stage]
    finished = []

    def keep(event) -> None:
        if isinstance(event, StageFinished):
            finished.append(event.result)

    row = verify_bug(spelling, REFERENCE.read_text(), quick(stage), Grounds(weights, answers), keep)
    assert row.status.value in ("failed", "error"), row
    assert row.named == spelling.fingerprint, (row, finished[-1].hint)
    assert row.ok
    assert_localised_cases_carry_their_map(spelling.id, finished[-1])
