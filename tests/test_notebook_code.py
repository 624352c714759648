"""Which of a notebook's code is graded (theinference/course/notebook.py, docs/notebooks.md),
the course notebook `init --notebook` writes, and what a check says when it cannot run. No
kernel here: tests/test_notebook.py runs one."""

import json

import nbformat
import pytest
from typer.testing import CliRunner

from theinference.cli import app
from theinference.course.notebook import (
    KVCACHE,
    NotebookError,
    course_files,
    extract,
    notebook_cells,
    notebook_course_files,
)
from theinference.curriculum.stages import load_stages
from theinference.notebook.course import course_notebook

STUDENT_CELLS = [
    ("cell 1", "%load_ext theinference\nfrom theinference.notebook import check"),
    ("cell 2", "import numpy as np\nfrom src.gpt2 import qkv\nEPS = 1e-5\n"
               "scale = lambda d: d**-0.5"),
    ("cell 3", "@staticmethod\ndef attn_step(h, w, layer, cache):\n    # why\n    return h\n"
               "out = attn_step(1, 2, 3, 4)\nprint(out)\nw = load_weights()\nfor i in range(3):\n"
               "    pass"),
    ("cell 4", "!pip install torch\nclass PrefixCache:\n    pass"),
    ("cell 5", "%%bash\necho hi"),
    ("cell 6", "def broken(:\n    pass"),
    ("cell 7", "%%check single-step-attention\ndef prefill(ids, w, mc):\n    return 1"),
    ("cell 8", 'check("single-step-attention")\n'),
    ("cell 9", "def run_prefill(prompt_ids):\n    return [0.0]"),
    ("cell 10", "try:\n    import torch\nexcept ImportError:\n    torch = None\n"
                "try:\n    print(1)\nexcept Exception:\n    pass"),
    ("cell 11", "logits = prefill([1, 2], W, None)\nW = load_weights()\nSIZES = sizes(W)\n"
                "def last(ids, mc):\n    logits = prefill(ids, W, mc)\n    return logits[SIZES]"),
]


def test_the_rule_keeps_definitions_and_constants_and_nothing_that_runs():
    """Would catch grading running a notebook's experiments (a call, a print, a loop, a
    weights load no definition reads, a top-level `logits` named like a function's local), a
    magic or shell line breaking its cell, theinference imported into the student's process,
    or a definition lost (decorator, comment, a %%check cell's body, a module-level value a
    function reads, an import guarded by try)."""
    found = extract(STUDENT_CELLS)
    code = found.code
    assert found.names == ["attn_step", "PrefixCache", "prefill", "run_prefill", "last"]
    assert found.unparsable == ["cell 6"]
    for kept in ("import numpy as np", "from src.gpt2 import qkv", "EPS = 1e-5",
                 "scale = lambda d: d**-0.5", "@staticmethod\ndef attn_step", "# why",
                 "class PrefixCache", "def prefill(ids, w, mc)", "# cell 3",
                 "import torch\nexcept ImportError:", "W = load_weights()", "SIZES = sizes(W)"):
        assert kept in code, kept
    for dropped in ("theinference", "attn_step(1, 2, 3, 4)", "print", "w = load_weights()",
                    "range(3)", "pip", "echo", "broken", "check(", "logits = prefill([1, 2]"):
        assert dropped not in code, dropped
    compile(code, "kvcache", "exec")


def test_the_course_files_put_the_code_after_the_stubs_and_rewire_own_adapters():
    """Would catch a notebook graded without the stubs (an undefined stage would be an error,
    not todo), its code placed before them (the stubs would win), or an adapter the notebook
    defines left unused."""
    files = course_files(extract(STUDENT_CELLS))
    kvcache = files[KVCACHE].decode()
    assert kvcache.index("raise NotImplementedError") < kvcache.index("def prefill(ids, w, mc)")
    adapters = files["tests/adapters.py"].decode()
    assert adapters.rstrip().endswith("from src.kvcache import run_prefill  # noqa: E402, F811")
    plain = course_files(extract(STUDENT_CELLS[:3]))["tests/adapters.py"].decode()
    assert "noqa: E402" not in plain


def notebook(*sources: str, kind: str = "code") -> bytes:
    cells = [{"cell_type": kind, "metadata": {}, "source": s.splitlines(True)} for s in sources]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                       "nbformat_minor": 5}).encode()


def test_an_ipynb_is_read_by_the_same_rule_and_refused_clearly_when_it_cannot_be():
    """Would catch list-of-lines sources mangled, markdown taken for code, or a malformed
    notebook or one with no code ending in a traceback instead of a message."""
    data = notebook("def attn_step(h, w, layer, cache):\n    return h\n", "x = f()")
    assert notebook_cells(data) == [("cell 1", "def attn_step(h, w, layer, cache):\n"
                                               "    return h\n"), ("cell 2", "x = f()")]
    assert b"def attn_step" in notebook_course_files(data)[KVCACHE]
    refused = {
        b'{"cells": [': "JSON is malformed",
        b'{"worksheets": []}': "no list of cells",
        notebook("def f():\n    pass", kind="markdown"): "no code cell",
        notebook("print(1)", "x = 2"): "defines no function or class",
    }
    for data, said in refused.items():
        with pytest.raises(NotebookError, match=said):
            notebook_course_files(data)


def test_init_writes_the_course_notebook_and_never_overwrites_it(tmp_path):
    """Would catch an invalid notebook, a stage without its guidance, stubs or check cell,
    or a student's notebook overwritten by a second init."""
    runner = CliRunner()
    result = runner.invoke(app, ["init", str(tmp_path / "c"), "--notebook"])
    assert result.exit_code == 0, result.output
    nb = nbformat.read(tmp_path / "c" / "kvcache.ipynb", as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]
    assert sources[1].startswith("%load_ext theinference")
    for stage in load_stages():
        check = sources.index(f'check("{stage.slug}")')
        assert "raise NotImplementedError" in sources[check - 1]
        assert stage.guidance[:60] in sources[check - 2]
    assert sources[-1] == "check()"
    again = runner.invoke(app, ["init", str(tmp_path / "c"), "--notebook"])
    assert again.exit_code == 3 and "not overwriting" in again.output
    assert runner.invoke(app, ["init", str(tmp_path / "t"), "--notebook", "--lang",
                               "ts"]).exit_code == 2


def test_the_course_notebook_as_graded_is_every_stub():
    """Would catch the course notebook's cells extracted to anything but the template's stubs
    (an untouched notebook must grade todo, never error)."""
    cells = [(f"cell {i}", c["source"]) for i, c in enumerate(course_notebook()["cells"])
             if c["cell_type"] == "code"]
    found = extract(cells)
    assert {"LayerCache", "ModelCache", "attn_step", "prefill", "PrefixCache"} <= set(found.names)
    assert found.unparsable == []
    compile(course_files(found)[KVCACHE], "kvcache", "exec")


def test_a_check_that_cannot_run_says_why_in_html_and_text():
    """Would catch a check's problem (an unknown stage) shown as a traceback, or unescaped."""
    from theinference.notebook.kernel import Checked

    checked = Checked(None, [], "unknown stage '<nope>'")
    assert not checked.passed
    assert "cannot check" in checked._repr_html_() and "&lt;nope&gt;" in checked._repr_html_()
    assert repr(checked) == "theinference: unknown stage '<nope>'"


def test_a_check_notes_a_cell_its_magic_lines_break_and_names_an_unknown_stage(monkeypatch):
    """Would catch definitions silently lost from a cell the kernel ran but the rule cannot
    parse once its magic lines are blanked (an indented `%time`), a note repeated for a cell
    the kernel itself refused, or an unknown stage graded as anything."""
    import sys

    from theinference.notebook.kernel import KernelCourse

    cells = [("In [1]", "def f():\n    %time g()"), ("In [2]", "def h(:\n"),
             ("In [3]", "def k():\n    %time g()\n    return 1")]  # parses, blanked
    monkeypatch.setattr(sys, "path", list(sys.path))  # the course's folder is added to it
    checked = KernelCourse(lambda: cells).check("no-such-stage")
    assert "no-such-stage" in checked.problem and checked.run is None
    assert len(checked.notes) == 1 and checked.notes[0].startswith("In [1] was left out")
    assert "In [1] was left out" in checked._repr_html_()
