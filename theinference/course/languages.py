"""The student's language: which worker runs their code, and the names reports use.

A course is Python unless its theinference.toml says `language = "ts"` or it has a
tests/adapters.ts. Grading is the same for both (stages, oracle, checks, fingerprints): only
the worker that runs the student's code and the names in messages differ. The TypeScript
worker (worker_node.mjs) runs under Node with the course's own tsx, installed by `npm install`.
"""

import re
import shutil
import tomllib
from dataclasses import fields, is_dataclass, replace
from pathlib import Path

PYTHON, TYPESCRIPT = "python", "ts"
LANGUAGES = (PYTHON, TYPESCRIPT)
HERE = Path(__file__).parent
TEMPLATES = {PYTHON: HERE / "templates" / "python", TYPESCRIPT: HERE / "templates" / "ts"}
ADAPTERS = {PYTHON: Path("tests/adapters.py"), TYPESCRIPT: Path("tests/adapters.ts")}
KVCACHE = {PYTHON: Path("src/kvcache.py"), TYPESCRIPT: Path("src/kvcache.ts")}
TSX_ENTRY = Path("node_modules/tsx/package.json")

# The course's Python names and their TypeScript spelling (the seeds' camelCase). Longest
# first where one contains another; applied to whole words only.
TS_NAMES = {
    "tests/adapters.py": "tests/adapters.ts",
    "src/kvcache.py": "src/kvcache.ts",
    "src/gpt2.py": "src/gpt2.ts",
    "len(prompt_ids)": "promptIds.length",
    "len(continuation_ids)": "continuationIds.length",
    "len(seq_ids)": "seqIds.length",
    "len(prompt)": "prompt.length",
    "os._exit": "process.exit",
    "sys.exit": "process.exit",
    "ValueError": "RangeError",
    "raise": "throw",
    "raises": "throws",
    "run_step_attention": "runStepAttention",
    "run_prefill_cache": "runPrefillCache",
    "run_prefill": "runPrefill",
    "run_decode_step": "runDecodeStep",
    "run_decode_sequence": "runDecodeSequence",
    "run_generate": "runGenerate",
    "run_prefix_caching": "runPrefixCaching",
    "attn_step": "attnStep",
    "layer_attn_incremental": "layerAttnIncremental",
    "embed_token": "embedToken",
    "block_step": "blockStep",
    "decode_step": "decodeStep",
    "decode_sequence": "decodeSequence",
    "attn_sublayer": "attnSublayer",
    "ln_rows": "lnRows",
    "recompute_logits": "recomputeLogits",
    "load_weights": "loadWeights",
    "prompt_ids": "promptIds",
    "continuation_ids": "continuationIds",
    "seq_ids": "seqIds",
    "next_id": "nextId",
    "max_new_tokens": "maxNewTokens",
    "token_id": "tokenId",
    "ln_hidden": "lnHidden",
}
_TS_PATTERN = re.compile(
    "|".join(rf"(?<![\w.]){re.escape(k)}(?![\w])" for k in sorted(TS_NAMES, key=len, reverse=True))
)


class LanguageError(Exception):
    """The course's language cannot run here; the message says the command that fixes it."""


def course_language(root: Path) -> str:
    """The language a course directory is written in."""
    try:
        settings = tomllib.loads((root / "theinference.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        settings = {}  # course.py reports an unreadable file; here it only means "not said"
    said = settings.get("language")
    if said is not None:
        if said not in LANGUAGES:
            raise LanguageError(
                f"{root / 'theinference.toml'}: language = {said!r}: choose one of "
                + ", ".join(repr(x) for x in LANGUAGES)
            )
        return said
    if (root / ADAPTERS[TYPESCRIPT]).is_file() and not (root / ADAPTERS[PYTHON]).is_file():
        return TYPESCRIPT
    return PYTHON


def check_runtime(root: Path, language: str) -> None:
    """Refuse up front, with the fix, a course whose runtime is missing."""
    if language != TYPESCRIPT:
        return
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


def localize(text: str, language: str) -> str:
    """Python names in a message, hint or guidance, spelled as the course's language has them."""
    if language != TYPESCRIPT or not text:
        return text
    return _TS_PATTERN.sub(lambda m: TS_NAMES[m.group(0)], text)


def localize_result(value, language: str):
    """A copy of a result (run, stage or case) with every message, hint and reason localized."""
    if language != TYPESCRIPT:
        return value
    if isinstance(value, list):
        return [localize_result(v, language) for v in value]
    if not is_dataclass(value) or isinstance(value, type):
        return value
    changes = {}
    for f in fields(value):
        item = getattr(value, f.name)
        if f.name in ("message", "hint", "reason", "bug_name") and isinstance(item, str):
            changes[f.name] = localize(item, language)
        elif f.name in ("stages", "cases"):
            changes[f.name] = localize_result(item, language)
    return replace(value, **changes)


def localizing(listener, language: str):
    """A run listener that hears results (case, stage, run) in the course's language's names."""
    if language != TYPESCRIPT:
        return listener

    def forward(event) -> None:
        if is_dataclass(event) and hasattr(event, "result"):
            event = replace(event, result=localize_result(event.result, language))
        listener(event)

    return forward
