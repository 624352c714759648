"""The one table of the course's classic bugs (bugs.toml), read once: each bug's name and hint
in the course's language, the checks it concerns, the variant that simulates it (variants.py)
and the errors it usually raises. Everything that names a bug quotes it from here."""

import math
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from theinference.oracle.config import GPT2_124M, HEAD_DIM, ModelConfig

TABLE = Path(__file__).with_name("bugs.toml")
TABLE_FORMAT = 1
FIRST_LANGUAGE = "python"  # every bug's words exist in it; another language's are optional
PLACEHOLDER = re.compile(r"\{(\w+)\}")


class BugTableError(Exception):
    """bugs.toml is malformed; the message says where."""


@dataclass(frozen=True)
class ErrorSignature:
    exception: str  # a regular expression matched against the exception's type name
    message: str  # searched in its message
    where: str  # searched in the trimmed traceback ("" = anywhere)
    means: str  # what the error says about the code, said before the bug's hint


@dataclass(frozen=True, eq=False)  # one object per id (the table is read once): hashed as such
class Bug:
    id: str
    names: dict[str, str]  # course language -> words
    hints: dict[str, str]
    checks: tuple[str, ...] = ()
    variant: str | None = None  # a key of variants.VARIANTS
    errors: tuple[ErrorSignature, ...] = ()

    def name(self, language: str = FIRST_LANGUAGE, config: ModelConfig = GPT2_124M) -> str:
        return sizes_quoted(in_language(self.names, language), config)

    def hint(self, language: str = FIRST_LANGUAGE, config: ModelConfig = GPT2_124M) -> str:
        return sizes_quoted(in_language(self.hints, language), config)


def in_language(texts: dict[str, str], language: str) -> str:
    return texts.get(language) or texts[FIRST_LANGUAGE]


def sizes_quoted(text: str, config: ModelConfig) -> str:
    """{n_embd}, {n_head}, {head_dim} ... replaced by the model's own sizes."""
    sizes = {
        "n_embd": config.n_embd,
        "n_head": config.n_head,
        "head_dim": HEAD_DIM,
        "sqrt_head_dim": f"{math.sqrt(HEAD_DIM):g}",
        "n_layer": config.n_layer,
        "n_ctx": config.n_ctx,
        "vocab": config.vocab_size,
    }
    return PLACEHOLDER.sub(lambda m: str(sizes.get(m.group(1), m.group(0))), text)


@cache
def bug_table(path: Path = TABLE) -> dict[str, Bug]:
    """Every bug, by id, in the table's order."""
    try:
        data = tomllib.loads(path.read_text())
        if data.get("format") != TABLE_FORMAT:
            raise BugTableError(f"{path.name}: format {data.get('format')} is not {TABLE_FORMAT}")
        return {bug_id: parsed(bug_id, entry) for bug_id, entry in data["bug"].items()}
    except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as exc:
        raise BugTableError(f"{path.name} is malformed: {exc!r}") from None


def parsed(bug_id: str, entry: dict) -> Bug:
    return Bug(
        id=bug_id,
        names=by_language(entry["name"]),
        hints=by_language(entry["hint"]),
        checks=tuple(entry.get("checks", ())),
        variant=entry.get("variant"),
        errors=tuple(ErrorSignature(**e) for e in entry.get("errors", ())),
    )


def by_language(value) -> dict[str, str]:
    """One text for every language, or a table of them that holds the first language's."""
    texts = value if isinstance(value, dict) else {FIRST_LANGUAGE: value}
    if FIRST_LANGUAGE not in texts:
        raise ValueError(f"no {FIRST_LANGUAGE} words in {value!r}")
    return {language: " ".join(str(text).split()) for language, text in texts.items()}


def bug(bug_id: str) -> Bug:
    return bug_table()[bug_id]


def bugs_of(checks: set[str]) -> list[Bug]:
    """The bugs that concern any of these checks, in the table's order."""
    return [b for b in bug_table().values() if checks & set(b.checks)]
