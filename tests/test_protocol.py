"""The worker protocol is stated once (theinference/student/worker/protocol.json) and every side
reads it from there: the grader (channel.py, replies.py, the swap plan), the Python worker and
the Node worker. These read the sources; tests/test_protocol_conformance.py runs both workers."""

import re
from pathlib import Path

from theinference.course import languages
from theinference.curriculum.checks import swap_search
from theinference.curriculum.checks.common import CHECKS
from theinference.student import replies, row_index
from theinference.student.worker import protocol

WORKER = Path(protocol.__file__).parent
NODE = sorted(WORKER.glob("worker_node*.mjs"))
PYTHON = [p for p in WORKER.glob("*.py") if p.name != "protocol.py"]
# a number written small enough to be a tolerance (1e-4, 0.002, 2e-3 ...)
SMALL_NUMBER = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?e-\d+|0\.0+[1-9]\d*)(?![\w.])")
GUARDS = {"1e-30", "1e-7"}  # no division by zero; no ambiguity factor of nothing: not tolerances


def test_the_swap_tolerance_is_the_protocols_and_the_graders_alone():
    """Catches a swap that matches rows by a tolerance of its own (a number written into the
    matching code instead of read from protocol.json, as the Node swap once matched within
    2e-3 * (1 + |x|) while the Python one matched by direction), and a worker that matches
    rows itself: the search is the grader's (swap_search.py), which a worker never sees the
    K/V to find for."""
    assert row_index.TOL == protocol.TOLERANCE
    assert row_index.PASSES == (protocol.FIRST_PASS, protocol.TOLERANCE)
    assert row_index.AMBIGUOUS == protocol.AMBIGUITY
    for source in [Path(row_index.__file__), WORKER / "cache_rows.py", Path(swap_search.__file__),
                   WORKER / "swap.py", WORKER / "worker_node_swap.mjs"]:
        written = set(SMALL_NUMBER.findall(source.read_text())) - GUARDS
        assert not written, (source.name, written)
    for worker_swap in [WORKER / "swap.py", WORKER / "worker_node_swap.mjs"]:
        text = worker_swap.read_text()
        assert "RowIndex" not in text and "tolerance" not in text.lower(), worker_swap.name
    assert "RowIndex" in Path(swap_search.__file__).read_text()
    assert not any("RowIndex" in p.read_text() for p in [*PYTHON, *NODE]), "a worker matches"


def test_every_outcome_a_worker_sends_is_one_the_grader_reads():
    """Catches a worker sending an outcome the grader would call a bad reply (or the grader
    accepting one that protocol.json does not name)."""
    assert replies.REPLY_KINDS == protocol.OUTCOMES
    sent = set()
    for path in PYTHON:
        sent |= set(re.findall(r'"outcome": "(\w+)"', path.read_text()))
    for path in NODE:
        sent |= set(re.findall(r'outcome: "(\w+)"', path.read_text()))
    assert sent and sent <= protocol.OUTCOMES, sent - protocol.OUTCOMES


def asked_names() -> set[str]:
    """Every adapter and hook the checks ask the student's process for."""
    asked = {c.adapter for c in CHECKS.values()} | {c.hook for c in CHECKS.values() if c.hook}
    assert len(asked) >= 8, asked  # every check module registers on import (checks/__init__)
    return asked


def test_every_name_the_grader_asks_for_is_spelled_by_the_language_object():
    """Catches an adapter or hook the grader asks for that the Node worker would be sent under
    the grader's own name (and call missing): each has its camelCase spelling in the
    TypeScript language object, the one table reports are told in too; a hook a check asks for
    is one the Node worker is given at its start; a refusal's exception reads back as the
    grader's."""
    camel = re.compile(r"[a-z][a-zA-Z0-9]*")
    for name in asked_names():
        assert camel.fullmatch(languages.TYPESCRIPT.spelled(name)), f"{name}: no camelCase"
        assert languages.PYTHON.spelled(name) == name
    assert {c.hook for c in CHECKS.values() if c.hook} <= set(protocol.HOOKS)
    for ours, theirs in languages.TYPESCRIPT.exceptions.items():
        assert languages.TYPESCRIPT.names[ours] == theirs  # the reports' word too
        assert languages.TYPESCRIPT.grader_exception(theirs) == ours
    assert languages.PYTHON.grader_exception("ValueError") == "ValueError"


def test_no_worker_and_no_protocol_states_a_languages_spelling_again():
    """Catches the TypeScript spelling of an adapter, a hook or an exception written into
    protocol.json or a worker file again (a second table to keep in step with
    course/languages/typescript.py): the grader sends the names spelled, and reads the
    exceptions back, through the language object alone."""
    spellings = {languages.TYPESCRIPT.spelled(name) for name in asked_names()}
    spellings |= set(languages.TYPESCRIPT.exceptions.values())
    spellings -= asked_names()  # spelled alike in both (prefill): nothing to restate
    assert "runGenerate" in spellings and "RangeError" in spellings, spellings
    sources = [WORKER / "protocol.json", WORKER / "protocol.py", *PYTHON, *NODE]
    for source in sources:
        text = source.read_text()
        restated = {word for word in spellings if re.search(rf"\b{word}\b", text)}
        assert not restated, (source.name, restated)
    assert "names" not in protocol.SPEC and set(protocol.SPEC["exceptions"]) == {"about", "todo"}


def test_the_node_worker_reads_the_protocol_rather_than_restating_it():
    """Catches the Node worker writing the framing or the item limit out by hand again (the
    drift protocol.json is there to end)."""
    text = "\n".join(path.read_text() for path in NODE)
    assert "protocol.json" in (WORKER / "worker_node_protocol.mjs").read_text()
    for restated in ("4096", "readBigUInt64LE(0)", "camelCase"):
        assert restated not in text, restated
