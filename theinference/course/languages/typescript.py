"""TypeScript: the course in the seeds' camelCase, run by the Node worker (worker_node.mjs)
under the course's own tsx, which `npm install` puts in its node_modules."""

import ast
import re
import shutil
from pathlib import Path

from theinference.course.languages.language import TEMPLATES, Language, LanguageError
from theinference.course.languages.runner import Runner

TSX_ENTRY = Path("node_modules/tsx/package.json")

# The exceptions the course's text names in Python and the TypeScript course throws instead:
# the Node worker reports a refusal as RangeError, which the grader reads as ValueError
EXCEPTIONS = {"ValueError": "RangeError"}

# What the seeds' camelCase cannot say: the course's files, code and words whose TypeScript is
# another expression, and the exceptions thrown instead
SPOKEN = {
    "tests/adapters.py": "tests/adapters.ts",
    "src/kvcache.py": "src/kvcache.ts",
    "src/gpt2.py": "src/gpt2.ts",
    "len(prompt_ids)": "promptIds.length",
    "len(continuation_ids)": "continuationIds.length",
    "len(seq_ids)": "seqIds.length",
    "len(prompt)": "prompt.length",
    "os._exit": "process.exit",
    "sys.exit": "process.exit",
    **EXCEPTIONS,
    "raise": "throw",
    "raises": "throws",
}
PYTHON_FILES = ("src/kvcache.py", "src/gpt2.py", "tests/adapters.py")
TS_FILES = ("src/kvcache.ts", "src/gpt2.ts", "tests/adapters.ts")
SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)+")


def camel(name: str) -> str:
    """decode_step -> decodeStep"""
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def defined_names(source: str) -> set[str]:
    """The functions, classes and parameters a Python file defines."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def camel_twins(python: Path, typescript: Path) -> dict[str, str]:
    """Every name the Python template defines whose camelCase the TypeScript template spells:
    a stage's adapter and stubs, written in both, are spelled here without being listed."""
    defined = set().union(*(defined_names((python / f).read_text()) for f in PYTHON_FILES))
    spelled = set(re.findall(r"\w+", " ".join((typescript / f).read_text() for f in TS_FILES)))
    return {name: camel(name) for name in sorted(defined)
            if SNAKE.fullmatch(name) and camel(name) in spelled}


# The course's Python names and their TypeScript spelling, the one statement of it: reports are
# told in these, and the grader asks the Node worker for the adapters and hooks by them
# (Language.spelled). Applied to whole words only.
NAMES = {**camel_twins(TEMPLATES / "python", TEMPLATES / "ts"), **SPOKEN}


def check_runtime(root: Path) -> None:
    """Refuse up front, with the fix, a course whose runtime is missing."""
    if shutil.which("node") is None:
        raise LanguageError(
            "this is a TypeScript course and Node.js is not on PATH: install Node 20 or later "
            "(https://nodejs.org), then run `npm install` in the course directory"
        )
    if not (root / TSX_ENTRY).is_file():
        raise LanguageError(
            f"this TypeScript course has no node_modules/tsx yet: run `npm install` in {root} "
            "(once; it installs the TypeScript runner from package.json)"
        )


# the Gradescope image's setup.sh lines for a TypeScript course
SETUP_NODE = """# the TypeScript course: Node 20 or later (NodeSource's where the image's is older);
# `gradescope warm` below installs the course's pinned runner (tsx) from its lock file, once
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
candidate=$(apt-cache policy nodejs | sed -n 's/ *Candidate: \\([0-9]*:\\)\\?\\([0-9]*\\).*/\\2/p')
if [ "$(node_major)" -lt 20 ] && [ "${candidate:-0}" -ge 20 ]; then
  apt-get install -y nodejs npm
fi
if [ "$(node_major)" -lt 20 ]; then
  apt-get install -y ca-certificates curl
  curl -fsSL https://deb.nodesource.com/setup_20.x | bash -
  apt-get install -y nodejs
fi
node --version && npm --version
"""

# what calibration multiplies with, as gpt2.ts does
KERNEL = ("src/kernel.ts", "src/kernel.wasm", "src/kernel-fma.wasm")
# SHA-256 of (kernel.ts, kernel.wasm) as earlier releases shipped them: named, not trusted
EARLIER_KERNELS = frozenset({
    ("18ab318646bb66b61f4db96d08469e19f3b203fb80558319899e642c11c69af0",
     "cb8df723f6500b0112ecde60bae10557092d7c459c5997e6200d919d300e60dd"),
    ("a703d9484cfabd7912e0ceec75cb32ba855c6a2f9ed6e6e9681d4266b63cc0e7",
     "be9b1b9371e58066d5976c21630bdf1ad26bdcedbf03f1417ff9a2f5c06a865b"),
    ("d40b5662fe1eac09015ea2dd021b92697e4e2d0f81fa6505d91ab0cc598c50ac",
     "be9b1b9371e58066d5976c21630bdf1ad26bdcedbf03f1417ff9a2f5c06a865b"),
})

TYPESCRIPT = Language(
    name="ts",
    title="TypeScript",
    template=TEMPLATES / "ts",
    adapters=Path("tests/adapters.ts"),
    kvcache=Path("src/kvcache.ts"),
    source_suffixes=(".ts", ".mts"),
    worker="worker_node.mjs",
    runtime="node",
    guardable=False,  # Node, through tsx, starts a helper process of its own
    calibration=(512, 768, 3072, 2),  # the kernel is a few times slower than BLAS: fewer
    check_runtime=check_runtime,
    names=NAMES,
    exceptions=EXCEPTIONS,
    first_steps="  npm install   # once: the TypeScript runner (tsx) and compiler, pinned\n",
    runner=Runner(TSX_ENTRY, TEMPLATES / "ts"),
    setup_lines=SETUP_NODE,
    provided_kernel=KERNEL,
    earlier_kernels=EARLIER_KERNELS,
)
