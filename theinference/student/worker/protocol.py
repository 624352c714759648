"""The wire protocol as the Python side reads it: protocol.json beside this file, which the Node
worker reads too (worker_node_protocol.mjs) and the grader's channel.py and replies.py import
from here. Part of the worker: imports nothing of the grader, and nothing heavy."""

import json
import os
import struct

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.json")) as _file:
    SPEC = json.load(_file)

_FRAMING = SPEC["framing"]
LENGTH = struct.Struct(_FRAMING["length"])  # a frame's length, before it
# a reply's head: its length, then its JSON header's length (one byte order: the first's)
REPLY_HEAD = struct.Struct(_FRAMING["length"] + _FRAMING["header_length"].lstrip("<>=!@"))
HEADER_LENGTH = struct.Struct(_FRAMING["header_length"])
BLOB_SIZES = _FRAMING["blob_sizes"]
MALFORMED_EXIT = _FRAMING["malformed_exit"]  # the worker's status on a request it cannot read

OUTCOMES = frozenset(SPEC["outcomes"])
KINDS = frozenset(SPEC["values"]["kinds"])
DTYPE_KINDS = frozenset(SPEC["values"]["dtype_kinds"])
LIMITS = SPEC["limits"]

WATCH_RETURNS = SPEC["hook"]["watch_returns"]
SWAP = SPEC["swap"]
SWAP_PLAN = tuple(SWAP["plan"])  # the plan's numbers, by these keys
TOLERANCE = float(SWAP["tolerance"])  # the one match tolerance (cache_rows.py, in the grader)
FIRST_PASS = float(SWAP["first_pass"])
AMBIGUITY = float(SWAP["ambiguity"])
# the grader's names of the functions a hook may wrap: the grader gives them to every worker
# as it starts, spelled as the course's language spells them (launch.py)
HOOKS = tuple(SPEC["hook"]["hooks"])
