"""The worker protocol is stated once (theinference/student/worker/protocol.json) and every side
reads it from there: the grader (channel.py, replies.py, the swap plan), the Python worker and
the Node worker. These read the sources; tests/test_protocol_conformance.py runs both workers."""

import re
from pathlib import Path

from theinference.course import languages
from theinference.curriculum.checks.common import CHECKS
from theinference.student import replies
from theinference.student.worker import cache_rows, protocol

WORKER = Path(protocol.__file__).parent
NODE = sorted(WORKER.glob("worker_node*.mjs"))
PYTHON = [p for p in WORKER.glob("*.py") if p.name != "protocol.py"]
# a number written small enough to be a tolerance (1e-4, 0.002, 2e-3 ...)
SMALL_NUMBER = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?e-\d+|0\.0+[1-9]\d*)(?![\w.])")
GUARDS = {"1e-30", "1e-7"}  # no division by zero; no ambiguity factor of nothing: not tolerances


def test_the_swap_tolerance_is_the_protocols_on_both_sides():
    """Catches a swap that matches rows by a tolerance of its own: a number written into
    either worker's matching code instead of read from protocol.json (as the Node swap once
    matched within 2e-3 * (1 + |x|) while the Python one matched by direction)."""
    assert cache_rows.TOL == protocol.TOLERANCE
    assert cache_rows.PASSES == (protocol.FIRST_PASS, protocol.TOLERANCE)
    assert cache_rows.AMBIGUOUS == protocol.AMBIGUITY
    for source in [WORKER / "cache_rows.py", WORKER / "swap.py", WORKER / "worker_node_swap.mjs"]:
        written = set(SMALL_NUMBER.findall(source.read_text())) - GUARDS
        assert not written, (source.name, written)
    node_swap = (WORKER / "worker_node_swap.mjs").read_text()
    assert "SWAP.tolerance" in node_swap and "SWAP.first_pass" in node_swap
    assert "SWAP.ambiguity" in node_swap


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


def test_every_name_the_grader_calls_has_its_typescript_spelling():
    """Catches an adapter or hook the grader asks for that the Node worker would look up under
    the grader's own name (and call missing), and a TypeScript spelling (of a name, or of the
    exception a refusal is) that the reports' names (course/languages/typescript.py) give
    otherwise."""
    asked = {c.adapter for c in CHECKS.values()} | {c.hook for c in CHECKS.values() if c.hook}
    assert len(asked) >= 8, asked  # every check module registers on import (checks/__init__)
    table = protocol.TS_NAMES
    for name in asked:
        spelled = table.get(name, name)
        assert "_" not in spelled, f"{name}: no TypeScript spelling in protocol.json"
        assert languages.TYPESCRIPT.names.get(name, spelled) == spelled, name
    assert set(protocol.SPEC["hook"]["hooks"]) <= set(table)
    for ts_name, python_name in protocol.SPEC["exceptions"]["ts"].items():
        # the reports' word
        assert languages.TYPESCRIPT.names.get(python_name) == ts_name, python_name


def test_the_node_worker_reads_the_protocol_rather_than_restating_it():
    """Catches the Node worker writing the framing, the item limit or the names table out by
    hand again (the drift protocol.json is there to end)."""
    text = "\n".join(path.read_text() for path in NODE)
    assert "protocol.json" in (WORKER / "worker_node_protocol.mjs").read_text()
    for restated in ("4096", "readBigUInt64LE(0)", "camelCase", "RangeError: \"ValueError\""):
        assert restated not in text, restated
