"""A toy stage, bug and language, added to a copy of the repository the way
docs/course-authors.md says to add them: tests/test_course_authors.py finds the files each one
touched and grades the toy.

The toy stage, toy-embedding, asks for one token's embedding at one position (run_embed_at);
one toy bug indexes with a float (its error names it), another ignores the position (the
stage's judge names it); the toy language is Python under other names
(src/toy_kvcache.py, tests/toy_adapters.py, its adapter spelled toy_run_embed_at), read by a
worker of its own, then run by a runtime of its own too."""

import hashlib
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("theinference", "tests", "docs", "README.md", "pyproject.toml")
LEFT_OUT = shutil.ignore_patterns("__pycache__", "node_modules", ".pytest_cache")
SLUG, BUG = "toy-embedding", "toy-position-ignored"
LANGUAGE, RUNTIME, WORKER = "toy", "toy-python", "worker_toy.py"
SPECS = Path("theinference/curriculum/specs")
CHECKS = Path("theinference/curriculum/checks")
PY_TEMPLATE, TS_TEMPLATE = (Path("theinference/course/templates") / n for n in ("python", "ts"))
SOLUTIONS, SOLUTIONS_TS = Path("tests/solutions"), Path("tests/solutions_ts")
LANGUAGES = Path("theinference/course/languages")


def copy_repository(dest: Path) -> Path:
    """The package, its tests and its pages, copied (not the runners' node_modules)."""
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=LEFT_OUT)
        else:
            shutil.copyfile(source, dest / name)
    return dest


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root, by its path: its content's digest."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def touched(before: dict[str, str], after: dict[str, str]) -> set[str]:
    """The places that differ: each file changed, added or removed, and a folder that is new
    as one place (`templates/toy/`)."""
    folders = {str(parent) for path in before for parent in Path(path).parents}
    places = set()
    for path in set(before) | set(after):
        if before.get(path) == after.get(path):
            continue
        new = [parent for parent in Path(path).parents if str(parent) not in folders]
        places.add(f"{new[-1]}/" if new else path)
    return places


# --- editing a file as an author would ---------------------------------------------------------


def write(root: Path, path: Path, text: str) -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


def append(root: Path, path: Path, text: str) -> None:
    write(root, path, (root / path).read_text() + text)


def replace_once(root: Path, path: Path, old: str, new: str) -> None:
    text = (root / path).read_text()
    assert text.count(old) == 1, (path, old)
    write(root, path, text.replace(old, new))


def insert_after_last_stage_row(root: Path, path: Path, row: str) -> None:
    """A row added to a page's table of stages, after the last stage's."""
    stages = {p.stem for p in (root / SPECS).glob("*.toml")}
    lines = (root / path).read_text().splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if (m := re.match(r"\| `([a-z0-9-]+)` \|", line))
            and m.group(1) in stages]
    lines.insert(rows[-1] + 1, row + "\n")
    write(root, path, "".join(lines))


# --- the toy stage ------------------------------------------------------------------------------

SPEC = """format = 1
title = "A token's embedding at its position (a toy stage)"
order = 100
requires = []
timeout = 60
score = 1

tolerance = { atol = 1e-6, rtol = 1e-5 }

guidance = \"\"\"
Implement embed_at(token_id, position, w) in src/kvcache.py: the token's row of wte plus the
row of wpe at the position it is given. Graded allclose atol {atol}, rtol {rtol}.
\"\"\"

[words]
mismatch = "embed_at adds the wpe row of the position it is given to the token's wte row."

[hidden]
count = 1
check = "toy_embedding"
token_id = { token = "any" }
position = { between = [0, 1023] }

[[cases]]
name = "token 464 at position 3"
check = "toy_embedding"
token_id = 464
position = 3

[[cases]]
name = "the last token id at the last position"
check = "toy_embedding"
token_id = 50256
position = 1023
"""

CHECKS_MODULE = '''"""toy-embedding: one token's embedding at one position."""

from theinference.curriculum.checks.common import Verdict, Words, check
from theinference.curriculum.checks.values import Wanted, vector_verdict

say = Words(__name__)


def token_and_position(case, config) -> list:
    return [int(case.inputs["token_id"]), int(case.inputs["position"])]


def embedding(recompute, args: list):
    token_id, position = args
    return recompute.w["wte.weight"][token_id] + recompute.w["wpe.weight"][position]


@check("toy_embedding", sized_by=(), adapter="run_embed_at", arguments=token_and_position,
       expect=embedding)
def toy_embedding(value, args, ask, tol, config) -> Verdict:
    """The token's row of wte plus the row of wpe at the position it was given."""
    wanted = Wanted("embedding", (config.n_embd,), say("mismatch"))
    verdict = vector_verdict(value, wanted, lambda: ask(args), tol, config)
    return verdict
'''

STUB = '''

# --- stage toy-embedding ---------------------------------------------------------------------


def embed_at(token_id: int, position: int, w: dict) -> np.ndarray:
    """[d]: the token's row of wte plus the row of wpe at `position`."""
    raise NotImplementedError("toy-embedding: implement embed_at in src/kvcache.py")
'''

STUB_TS = '''
// --- stage toy-embedding ---------------------------------------------------------------------

// [d]: the token's row of wte plus the row of wpe at `position`.
export function embedAt(tokenId: number, position: number, w: Weights): Float32Array {
  throw new NotImplementedError("toy-embedding: implement embedAt in src/kvcache.ts");
}
'''

ADAPTER = '''

def run_embed_at(token_id: int, position: int):
    """toy-embedding: token_id's embedding at position, [d]."""
    return embed_at(token_id, position, load_weights())
'''

ADAPTER_TS = '''
// toy-embedding: tokenId's embedding at position, [d].
export async function runEmbedAt(tokenId: number, position: number): Promise<Float32Array> {
  return embedAt(tokenId, position, await loadWeights());
}
'''

SOLUTION = '''

def embed_at(token_id, position, w):
    row = position
    return w["wte.weight"][token_id] + w["wpe.weight"][row]
'''

SOLUTION_TS = '''
export function embedAt(tokenId: number, position: number, w: Weights): Float32Array {
  const at = position;
  return embedToken(tokenId, at, w);
}
'''

PLANTED = f'''
[[bugs]]
id = "{BUG}"
stage = "{SLUG}"
old = "row = position"
new = "row = 0"
'''

PLANTED_TS = f'''
[[bugs]]
id = "toy-position-off-by-one"
stage = "{SLUG}"
old = "const at = position;"
new = "const at = position + 1;"
'''

ROW = "| `toy-embedding` | `run_embed_at(token_id, position)`: `[768]`, the token's embedding | atol 1e-6, rtol 1e-5 |"  # noqa: E501
ROW_REFERENCE = "| `toy-embedding` | `run_embed_at(token_id, position)` | `[768]` the token's embedding at the position | `wte[token_id] + wpe[position]` | atol 1e-6, rtol 1e-5 |"  # noqa: E501


def add_stage(root: Path) -> None:
    """The toy stage in each of its places (its planted bugs fail it, none is named yet)."""
    write(root, SPECS / f"{SLUG}.toml", SPEC)
    write(root, CHECKS / "toy_embedding.py", CHECKS_MODULE)
    append(root, PY_TEMPLATE / "src/kvcache.py", STUB)
    append(root, TS_TEMPLATE / "src/kvcache.ts", STUB_TS)
    replace_once(root, PY_TEMPLATE / "tests/adapters.py", "    decode_step,\n",
                 "    decode_step,\n    embed_at,\n")
    append(root, PY_TEMPLATE / "tests/adapters.py", ADAPTER)
    replace_once(root, TS_TEMPLATE / "tests/adapters.ts", "  decodeStep,\n",
                 "  decodeStep,\n  embedAt,\n")
    append(root, TS_TEMPLATE / "tests/adapters.ts", ADAPTER_TS)
    insert_after_last_stage_row(root, Path("README.md"), ROW)
    insert_after_last_stage_row(root, Path("docs/reference.md"), ROW_REFERENCE)
    for solution in ("reference_kvcache.py", "independent_kvcache.py", "paged_kvcache.py",
                     "transformers_kvcache.py"):
        append(root, SOLUTIONS / solution, SOLUTION)
    replace_once(root, SOLUTIONS / "transformers_adapters.py", "    embed,\n",
                 "    embed,\n    embed_at,\n")
    replace_once(root, SOLUTIONS / "transformers_adapters.py", "from src.kvcache import (\n",
                 "from src.gpt2 import load_weights\nfrom src.kvcache import (\n")
    append(root, SOLUTIONS / "transformers_adapters.py", ADAPTER)
    append(root, SOLUTIONS / "bugs.toml", PLANTED)
    append(root, SOLUTIONS_TS / "reference_kvcache.ts", SOLUTION_TS)
    append(root, SOLUTIONS_TS / "bugs.toml", PLANTED_TS)


# --- two toy bugs: one named by the error it raises, one by the stage's judge ------------------

FLOAT_POSITION = "toy-float-position"
ERROR_CATALOGUED = f'''
[bug.{FLOAT_POSITION}]
name = "indexed wpe with a position made a float"
hint = "Index wpe with the integer position embed_at is given: a division makes it a float."

[[bug.{FLOAT_POSITION}.errors]]
exception = "IndexError"
message = "only integers, slices"
where = "embed_at"
means = "An array was indexed with a float."
'''


def add_error_bug(root: Path) -> None:
    """A bug the grader names by the error it raises: its entry and its row, nothing more."""
    append(root, Path("theinference/diagnosis/bugs.toml"), ERROR_CATALOGUED)
    add_bug_row(root, FLOAT_POSITION, "indexed wpe with a position made a float", "its error")


def add_bug_row(root: Path, bug: str, name: str, named_from: str) -> None:
    row = f"| `{bug}` | {name} | {named_from} |\n"
    replace_once(root, Path("docs/reference.md"), "<!-- /bugs -->", row + "<!-- /bugs -->")


CATALOGUED = f'''
[bug.{BUG}]
name = "embedded the token at position 0, whatever position it was given"
hint = "Add the wpe row of the position embed_at is given, not wpe[0]."
checks = ["toy_embedding"]
'''

RECOGNISED = '''    if verdict.actual is not None:  # the position ignored: the embedding at 0
        at_zero = ask([args[0], 0])
        if np.allclose(verdict.actual, at_zero, rtol=tol.rtol, atol=tol.atol):
            verdict.suspected_bug = "toy-position-ignored"
    return verdict
'''


def add_bug(root: Path) -> None:
    """The toy stage's planted bug, catalogued and named by the stage's judge."""
    append(root, Path("theinference/diagnosis/bugs.toml"), CATALOGUED)
    add_bug_row(root, BUG, "embedded the token at position 0, whatever position it was given",
                "its check, by itself")
    module = CHECKS / "toy_embedding.py"
    replace_once(root, module, "    return verdict\n", RECOGNISED)
    replace_once(root, module, '"""\n\nfrom', '"""\n\nimport numpy as np\n\nfrom')
    replace_once(root, SOLUTIONS / "bugs.toml", 'new = "row = 0"\n',
                 f'new = "row = 0"\nfingerprint = "{BUG}"\n')


# --- the toy language: Python under other names, with a runtime of its own ----------------------

LANGUAGE_MODULE = f'''"""Toy: the Python course under other names, read by a worker of its own."""

from pathlib import Path

from theinference.course.languages.language import TEMPLATES, Language

TOY = Language(
    name="{LANGUAGE}",
    title="Toy",
    template=TEMPLATES / "{LANGUAGE}",
    adapters=Path("tests/toy_adapters.py"),
    kvcache=Path("src/toy_kvcache.py"),
    source_suffixes=(".py",),
    worker="{WORKER}",
    runtime="python",
    guardable=True,
    calibration=(512, 768, 3072, 6),
    names={{"run_embed_at": "toy_run_embed_at"}},
)
'''

TOY_WORKER = '''"""The toy language's worker: the Python worker, the course's adapters read from
tests/toy_adapters.py where it imports tests/adapters.py."""

import importlib.util
import os
import runpy
import sys


class ToyAdapters:
    def find_spec(self, name, path=None, target=None):
        if name != "tests.adapters":
            return None
        adapters = os.path.join(os.getcwd(), "tests", "toy_adapters.py")
        return importlib.util.spec_from_file_location(name, adapters)


sys.meta_path.insert(0, ToyAdapters())
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py"),
               run_name="__main__")
'''


def add_language(root: Path) -> None:
    """The toy language in each of its places."""
    write(root, LANGUAGES / f"{LANGUAGE}.py", LANGUAGE_MODULE)
    typescript = "from theinference.course.languages.typescript import TYPESCRIPT\n"
    replace_once(root, LANGUAGES / "__init__.py", typescript,
                 typescript + "from theinference.course.languages.toy import TOY\n")
    replace_once(root, LANGUAGES / "__init__.py", "ALL = (PYTHON, TYPESCRIPT)",
                 "ALL = (PYTHON, TYPESCRIPT, TOY)")
    template = Path("theinference/course/templates") / LANGUAGE
    shutil.copytree(root / PY_TEMPLATE, root / template, ignore=LEFT_OUT)
    (root / template / "src/kvcache.py").rename(root / template / "src/toy_kvcache.py")
    adapters = template / "tests/toy_adapters.py"
    (root / template / "tests/adapters.py").rename(root / adapters)
    replace_once(root, adapters, "from src.kvcache import", "from src.toy_kvcache import")
    replace_once(root, adapters, "def run_embed_at(", "def toy_run_embed_at(")
    append(root, template / "theinference.toml", f'language = "{LANGUAGE}"\n')
    solutions = Path(f"tests/solutions_{LANGUAGE}")
    reference = (root / SOLUTIONS / "reference_kvcache.py").read_text()
    write(root, solutions / "reference_toy_kvcache.py", reference)
    write(root, solutions / "bugs.toml", "format = 1\n" + PLANTED + f'fingerprint = "{BUG}"\n')
    write(root, Path("theinference/student/worker") / WORKER, TOY_WORKER)


def add_runtime(root: Path) -> None:
    """The toy language run by a runtime of its own (Python's command, under another name)."""
    replace_once(root, LANGUAGES / f"{LANGUAGE}.py", 'runtime="python"', f'runtime="{RUNTIME}"')
    runtimes = '"python": python_argv, "node": node_argv'
    replace_once(root, Path("theinference/student/launch.py"), runtimes,
                 f'{runtimes}, "{RUNTIME}": python_argv')
