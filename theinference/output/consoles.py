"""The consoles reports are printed on. A terminal wraps at its width, by words. Anything else
(a file, a pipe, a CI log) gets lines without padding: rich pads table cells and measured
blocks to their width, which a terminal hides and a log keeps as trailing spaces."""

import os
import sys

from rich.console import Console

UNLIMITED = 10_000  # columns when stdout is not a terminal: a log is never hard-wrapped


class TrimmedLines:
    """A text stream that drops the spaces ending each line. Spaces at the end of a write are
    held back until the next write shows whether its line ends there."""

    def __init__(self, stream):
        self.stream = stream
        self.held = ""

    def write(self, text: str) -> int:
        lines = (self.held + text).split("\n")
        last = lines[-1].rstrip(" ")
        self.held = lines[-1][len(last):]
        self.stream.write("\n".join([line.rstrip(" ") for line in lines[:-1]] + [last]))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"


def console(stderr: bool = False) -> Console:
    """A terminal wraps at its width; so does a pipe given a width by COLUMNS. A pipe given
    none keeps its lines whole (soft wrap, no width), so a log is never cut at 80. (A
    soft-wrapped console with a width would crop what is indented, hints included.)"""
    out = Console(stderr=stderr, highlight=False)
    if out.is_terminal:
        return out
    stream = TrimmedLines(sys.stderr if stderr else sys.stdout)
    if os.environ.get("COLUMNS"):
        return Console(file=stream, highlight=False)
    return Console(file=stream, highlight=False, soft_wrap=True, width=UNLIMITED)


def trimmed(text: str) -> str:
    """Rendered text without the spaces that pad its lines."""
    return "\n".join(line.rstrip() for line in text.split("\n"))
