"""The course notebook `theinference init DIR --notebook` writes: the stages in order, each its
guidance as markdown, its stubs (the template's src/kvcache.py, cut at its stage markers) as a
code cell, and a check cell after it. nbformat 4.5, written as plain JSON."""

import json
import re

from theinference.course import languages
from theinference.course.notebook import KVCACHE
from theinference.curriculum.stages import Stage, load_stages

NOTEBOOK_NAME = "kvcache.ipynb"
STAGE_MARKER = re.compile(r"^# --- stage (\S+) -+\n", re.MULTILINE)

INTRO = """# A KV cache for GPT-2, stage by stage

Write each stage's functions in the code cell under its guidance, run the cell, then run the
check cell after it: it grades your functions as this notebook defines them now, on the same
cases as `theinference test`, and shows where your numbers depart and the bug it recognises.
Fix, rerun your cell, rerun the check.

What is graded: every code cell's `def`, `class`, `import` and constant (`EPS = 1e-5`), and
what your functions read from the notebook, in the order the cells ran; calls, prints and
experiments are not, so try things out freely. A
function you have not written yet stays a stub (`todo`). Your functions run in a separate
process: one that raises or never returns costs its check, never this kernel. The guidance
speaks of a course directory: its `src/kvcache.py` is this notebook's code cells, and the
adapters of `tests/adapters.py`, which call your functions, are wired for you.

On Colab, or in a kernel without theinference, run `%pip install theinference` first."""

SETUP = """%load_ext theinference
# weights: "synthetic" (built in, made on first use) or "gpt2" (the real one, from the Hub)
configure(weights="synthetic")"""

PROVIDED = """## The building blocks

The provided GPT-2 (`src.gpt2`: `load_weights`, `embed`, `ln_rows`, `qkv`, `mlp`, `unembed`,
`recompute_logits`...) is importable here as in a course directory; `load_weights()` reads the
weights the checks grade against. The cache's classes follow: keep or change them."""


def course_notebook() -> dict:
    imports, classes, stubs = template_parts()
    cells = [markdown(INTRO), code(SETUP), markdown(PROVIDED), code(imports), code(classes)]
    for stage in load_stages():
        cells += [markdown(stage_text(stage)), code(stubs[stage.slug]),
                  code(f'check("{stage.slug}")')]
    cells += [markdown("## Every stage\n\nOnce each stage passes, check them all together."),
              code("check()")]
    for index, cell in enumerate(cells):
        cell["id"] = f"cell-{index}"
    return {"cells": cells, "metadata": METADATA, "nbformat": 4, "nbformat_minor": 5}


METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def notebook_json() -> str:
    return json.dumps(course_notebook(), indent=1, ensure_ascii=False) + "\n"


def template_parts() -> tuple[str, str, dict[str, str]]:
    """The template's src/kvcache.py as (imports, the cache's classes, {slug: stubs})."""
    text = (languages.DEFAULT.template / KVCACHE).read_text()
    pieces = STAGE_MARKER.split(text)
    head, stubs = pieces[0], dict(zip(pieces[1::2], pieces[2::2], strict=True))
    body = head.split('"""', 2)[2]  # after the module's docstring
    imports, classes = body.split("\nclass ", 1)
    return imports.strip(), ("class " + classes).strip(), {k: v.strip() for k, v in stubs.items()}


def stage_text(stage: Stage) -> str:
    from theinference.curriculum.checks import CHECKS
    from theinference.diagnosis.bugs import bugs_of

    checks = {name for name, check in CHECKS.items() if check.stage == stage.slug}
    bugs = "\n".join(f"- **{b.name('python')}**: {b.hint('python')}" for b in bugs_of(checks))
    listed = f"\n\nThe bugs the grader can name here:\n\n{bugs}" if bugs else ""
    return f"## {stage.title} (`{stage.slug}`)\n\n{stage.guidance}{listed}"


def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def code(text: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [],
            "execution_count": None}
