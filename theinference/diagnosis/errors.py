"""Teaching on errors: an exception the student's code raised, matched to the classic bug that
usually raises it (the `errors` of bugs.toml), as the fingerprints match a wrong answer.

A signature is the exception's type, a pattern on its message and, optionally, a pattern on
where it was raised (the trimmed traceback: file, function, source line). What is matched is
the student's own exception, never a message of the grader's.
"""

import re

from theinference.diagnosis.bugs import Bug, ErrorSignature, bug_table
from theinference.results import CaseResult, Status

EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ?(.*)$")


def raised(case: CaseResult) -> tuple[str, str] | None:
    """(exception type, message) of an error case, from the last line of its traceback."""
    for text in (case.traceback, case.message):
        for line in reversed(text.strip().splitlines()):
            found = EXCEPTION_LINE.match(line.strip())
            if found:
                return found.group(1).rsplit(".", 1)[-1], found.group(2)
    return None


def lesson_for(case: CaseResult) -> tuple[Bug, ErrorSignature] | None:
    """The classic bug behind an error case, and the signature that names it."""
    if case.status != Status.ERROR or (exc := raised(case)) is None:
        return None
    kind, message = exc
    for bug in bug_table().values():
        for sig in bug.errors:
            if (
                re.fullmatch(sig.exception, kind)
                and re.search(sig.message, message)
                and re.search(sig.where, case.traceback or case.message)
            ):
                return bug, sig
    return None


def shares_one_error(cases: list[CaseResult]) -> bool:
    """Every case that did not pass (two or more) raised the same error."""
    errors = [c for c in cases if c.status == Status.ERROR]
    if len(errors) < 2 or len(errors) != sum(c.status != Status.PASSED for c in cases):
        return False
    return len({(c.traceback or c.message).strip() for c in errors}) == 1
