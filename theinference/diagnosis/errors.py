"""Teaching on errors: an exception the student's code raised, matched to the classic bug that
usually raises it, as the numeric fingerprints match a wrong answer to a bug.

A signature is the exception's type, a pattern on its message and, optionally, a pattern on
where it was raised (the trimmed traceback: file, function, source line). Plain data, read by
the report; nothing here runs the student's code or imports rich.
"""

import re
from dataclasses import dataclass
from functools import cache

from theinference.curriculum.stages import load_stages
from theinference.results import CaseResult, StageResult, Status


@dataclass(frozen=True)
class Lesson:
    bug: str  # a stable id; the numeric catalogue's id where the same bug is catalogued
    name: str  # what the student did, in the course's words
    hint: str  # what to do instead


@dataclass(frozen=True)
class ErrorSignature:
    exception: str  # the exception's type name
    message: str  # a regular expression searched in its message
    where: str  # a regular expression searched in the traceback ("" = anywhere)
    lesson: Lesson


CACHE_LAYOUT = (
    "The cache holds [heads, positions, head_dim] per layer; one new position's k and v are "
    "[heads, 1, head_dim] and are appended along axis 1."
)

SIGNATURES = [
    ErrorSignature(
        "ValueError",
        r"zero-size array to reduction operation",
        r"softmax|attend|attn|scores",
        Lesson(
            "attend-old-length",
            "attended over the cache before appending the new K/V",
            "At the first step the cache is still empty, so softmax gets zero scores. Append "
            "this position's k and v first, then attend over every cached row, its own included.",
        ),
    ),
    ErrorSignature(
        "IndexError",
        r"out of bounds for axis 0 with size (1024|\d+)",
        r"wpe|position|embed",
        Lesson(
            "position-counter",
            "the position counter ran past the context",
            "A position reached len(wpe). The new token's position is the number of rows cached "
            "before it (the length before the append), advanced once per token, not per layer.",
        ),
    ),
    ErrorSignature(
        "ValueError",
        r"concatenation axis must match exactly",
        r"concatenate|append",
        Lesson("cache-append-axis", "appended the new K/V along the wrong axis", CACHE_LAYOUT),
    ),
    ErrorSignature(
        "ValueError",
        r"could not be broadcast together",
        r"attend|attn|scores|cache|softmax",
        Lesson("cache-layout", "the cache and the new K/V are laid out differently", CACHE_LAYOUT),
    ),
    ErrorSignature(
        "ValueError",
        r"matmul: Input operand 1 has a mismatch in its core dimension",
        r"attend|attn|scores|@",
        Lesson(
            "keys-not-transposed",
            "multiplied q by the keys without transposing them",
            "Scores are q @ k with k's last two axes swapped: [heads, 1, head_dim] @ "
            "[heads, head_dim, positions] -> [heads, 1, positions].",
        ),
    ),
    ErrorSignature(
        "ValueError",
        r"cannot reshape array of size",
        r"split|heads|reshape",
        Lesson(
            "heads-split-wrongly",
            "split the heads with the wrong sizes",
            "[n, 768] -> reshape [n, 12, 64] -> transpose to [12, n, 64]; merging is the reverse.",
        ),
    ),
    ErrorSignature(
        "(TypeError|AttributeError)",
        r"'NoneType' object (is not subscriptable|is not iterable|has no attribute)",
        r"",
        Lesson(
            "missing-return",
            "used the result of a function that returns nothing",
            "A function without a return statement gives None: return the array it computes.",
        ),
    ),
]

EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ?(.*)$")


def raised(case: CaseResult) -> tuple[str, str] | None:
    """(exception type, message) of an error case, from the last line of its traceback."""
    for text in (case.traceback, case.message):
        for line in reversed(text.strip().splitlines()):
            found = EXCEPTION_LINE.match(line.strip())
            if found:
                return found.group(1).rsplit(".", 1)[-1], found.group(2)
    return None


def lesson_for(case: CaseResult) -> Lesson | None:
    """The classic bug behind an error case, when its signature is catalogued."""
    if case.status != Status.ERROR or (exc := raised(case)) is None:
        return None
    kind, message = exc
    for sig in SIGNATURES:
        if (
            re.fullmatch(sig.exception, kind)
            and re.search(sig.message, message)
            and re.search(sig.where, case.traceback or case.message)
        ):
            return sig.lesson
    return None


def shared_error(stage: StageResult) -> str | None:
    """The error every non-passing case of the stage shares, when they all share one."""
    errors = [c for c in stage.cases if c.status == Status.ERROR]
    if len(errors) < 2 or len(errors) != sum(c.status != Status.PASSED for c in stage.cases):
        return None
    texts = {(c.traceback or c.message).strip() for c in errors}
    return texts.pop() if len(texts) == 1 else None


def is_import_failure(case: CaseResult) -> bool:
    return case.status == Status.ERROR and case.message.startswith("importing tests/adapters.py")


REUSED_NOTHING = re.compile(r"\(reused 0 of \d+\)")
CACHE_DEPARTS = re.compile(r"layer (\d+) ([KV]) departs at position (\d+)")


@cache
def stage_hint(key: str) -> str | None:
    """The hint a stage's [words] give under `key` (the stage that can produce the situation
    says what it means; this module names no stage)."""
    return next((s.words[key] for s in load_stages() if key in s.words), None)


def fitting_hint(case: CaseResult) -> str:
    """The case's hint, unless its own message shows that the hint's premise does not hold:
    a prefix-caching prompt that reused nothing went through prefill alone; a cache whose
    shapes are right and whose first layers match has no row-count problem."""
    if REUSED_NOTHING.search(case.message) and (hint := stage_hint("reused_nothing")):
        return hint
    departs = CACHE_DEPARTS.search(case.message)
    if departs and "prompt_len rows" in case.hint:
        layer, name = int(departs.group(1)), departs.group(2)
        if layer == 0:
            return (
                f"The shapes are right but layer 0's {name} already differs: check what is "
                "written, the q/k/v split of c_attn, the head split, and the positions embedded."
            )
        return (
            f"The shapes are right and layers 0-{layer - 1} match, so the row count is fine: "
            f"layer {layer}'s input is wrong. Feed each layer the previous layer's full output "
            "(attention and MLP residuals included), and give every layer its own cache."
        )
    return case.hint


@dataclass(frozen=True)
class Diagnosis:
    """What the report pins under a stage that did not pass."""

    bug: str | None  # the suspected bug, in words
    hint: str  # the hint that fits it
    first: CaseResult | None  # the first case that did not pass: shown in full
    worst: CaseResult | None  # the case furthest past the tolerance, when another one


def diagnose(stage: StageResult) -> Diagnosis:
    """The stage's suspected bug and hint: its own when the run set them, else the first case
    a known bug matches, else the lesson of the first error with a catalogued signature, else
    the hint of the case it sits under (never a hint taken from another failure)."""
    bad = [c for c in stage.cases if c.status not in (Status.PASSED, Status.SKIPPED)]
    first = bad[0] if bad else None
    worst = worst_case(stage)
    worst = worst if worst is not None and worst is not first else None
    if stage.suspected_bug:
        name = bug_name(stage.suspected_bug)
        return Diagnosis(name, strip_bug(stage.hint, name), first, worst)
    if len(stage.candidates) > 1:  # several bugs give these very numbers: name them all
        name = "one of " + " or ".join(bug_name(c) for c in stage.candidates)
        return Diagnosis(name, stage.hint, first, worst)
    for case in bad:
        if case.suspected_bug:
            name = bug_name(case.suspected_bug)
            return Diagnosis(name, strip_bug(fitting_hint(case), name), case, worst)
    for case in bad:
        if (lesson := lesson_for(case)) is not None:
            return Diagnosis(lesson.name, lesson.hint, case, worst)
    return Diagnosis(None, fitting_hint(first) if first else stage.hint, first, worst)


def worst_case(stage: StageResult) -> CaseResult | None:
    """The failing case whose answer lands furthest past the tolerance."""
    scored = [
        (max(c.worst for c in case.comparisons), case)
        for case in stage.cases
        if case.status == Status.FAILED and case.comparisons
    ]
    return max(scored, key=lambda pair: pair[0])[1] if scored else None


def worst_multiple(case: CaseResult) -> float:
    return max((c.worst for c in case.comparisons), default=0.0)


def bug_name(bug_id: str) -> str:
    from theinference.diagnosis.fingerprints import BY_ID

    bug = BY_ID.get(bug_id)
    return bug.name if bug is not None else bug_id


def strip_bug(hint: str, name: str) -> str:
    """A hint without its leading "suspected bug: NAME." (the report shows the name)."""
    return hint.removeprefix(f"suspected bug: {name}.").strip()
