"""The course's classic bugs (tests/solutions/bugs.toml), as the test suite reads them."""

from pathlib import Path

from theinference.grading.verify import load_bugs

SOLUTIONS = Path(__file__).parent / "solutions"
REFERENCE = SOLUTIONS / "reference_kvcache.py"
BUGS = load_bugs(SOLUTIONS / "bugs.toml")


def planted(bug_id: str) -> str:
    (bug,) = [b for b in BUGS if b.id == bug_id]
    return bug.planted(REFERENCE.read_text())
