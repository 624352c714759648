"""Student text made inert for each place it is written.

The student's process controls much of what a report shows: its stdout and stderr, its
tracebacks and exception messages, the type names of what it returned, the names of the files
in a submission. None of it may act on what shows it: no escape sequence may reach a terminal
(one could erase lines and draw a "passed" above the real verdict), no character XML 1.0
forbids may reach junit.xml, no fence may close early in Gradescope's markdown, no tag may
reach a page. Each writer passes student text through the function for its medium:

- terminal_text: C0 and C1 controls, DEL, bidirectional overrides and lone surrogates shown
  visibly (`\\x1b[2K`), newlines and tabs kept, a Windows line end made a newline;
- xml_text: the same, which also leaves nothing XML 1.0 forbids;
- markdown_fence: a fenced block whose fence is longer than any backtick run inside;
- markdown_text: inline markdown with HTML escaped and markdown's punctuation backslashed;
- html_text: HTML-escaped; csv_cell: a cell no spreadsheet reads as a formula.

`inert_copy` applies one of them to every string in a result (dataclasses, lists, dicts), so a
writer can clean a whole run at its entry, whatever fields the results grow.
"""

import html
import re
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from enum import Enum

# controls and the code points that reorder or cannot be encoded; \t and \n are kept
UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
    "\ud800-\udfff\ufffe\uffff]"
)
MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|~:=])")
BACKTICK_RUN = re.compile("`+")
FORMULA_START = ("=", "+", "-", "@")


def shown(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: str) -> str:
    """Text a terminal shows as it is: every control visible, none acted on."""
    return UNSAFE.sub(lambda m: shown(m.group()), text.replace("\r\n", "\n"))


def xml_text(text: str) -> str:
    """Text XML 1.0 allows, controls visible (an XML writer escapes <, > and & itself)."""
    return terminal_text(text)


def markdown_text(text: str) -> str:
    """Inline markdown that renders as the text: no heading, list, link, image, emphasis,
    table cell or HTML can start inside it."""
    escaped = html.escape(terminal_text(text), quote=False)
    return MARKDOWN_PUNCTUATION.sub(r"\\\1", escaped)


def markdown_fence(text: str) -> str:
    """A fenced block holding the text verbatim: its fence is longer than any run of
    backticks in the text, so nothing inside can close it (and nothing inside is HTML)."""
    text = terminal_text(text)
    longest = max((len(run) for run in BACKTICK_RUN.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def html_text(text: str) -> str:
    """Text for an HTML page or attribute: escaped, controls visible."""
    return html.escape(terminal_text(text))


def csv_cell(text: str) -> str:
    """A spreadsheet cell that stays text: a leading =, +, - or @ would make it a formula."""
    text = terminal_text(text)
    return "'" + text if text.startswith(FORMULA_START) else text


def no_surrogates(text: str) -> str:
    """Text any UTF-8 writer can encode: lone surrogates (undecodable file names, a reply's
    JSON escapes) become U+FFFD. For JSON, which keeps the student's text otherwise raw."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def inert_copy(value, clean: Callable[[str], str]):
    """A copy of a result with `clean` applied to every string in it: dataclasses (through
    their fields), lists, tuples and dict values. Enums (statuses) and numbers stay as they are."""
    if isinstance(value, Enum):
        return value
    if isinstance(value, str):
        return clean(value)
    if is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: inert_copy(getattr(value, f.name), clean) for f in fields(value)
                   if f.init}
        return replace(value, **changed)
    if isinstance(value, list | tuple):
        return type(value)(inert_copy(v, clean) for v in value)
    if isinstance(value, dict):
        return {k: inert_copy(v, clean) for k, v in value.items()}
    return value
