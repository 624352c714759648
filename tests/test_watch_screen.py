"""The watcher as a student lives in it: a real pseudo-terminal (pexpect), the screen as a
terminal shows it (pyte), the classic mistakes made one by one in a course from the template."""

import os
import sys
import time
from pathlib import Path

import pytest

from tests.bugs import planted
from tests.helpers import make_course, reference_text

pexpect = pytest.importorskip("pexpect")
pyte = pytest.importorskip("pyte")

ROWS, COLS = 45, 140
# the small cases only: the screen is under test, not the student's 1024-token compute
SMALL_CASES = ("--case", "one token", "--case", "two tokens")
DRAWN = b"watching for changes"  # the last line of every finished run's screen

# a crash rather than a wrong number: attending while the cache is still empty
ATTEND_BEFORE_APPEND = (
    "    append_kv(cache, k, v)\n    return attend(q, cache, w, layer)",
    "    a = attend(q, cache, w, layer)\n    append_kv(cache, k, v)\n    return a",
)
NAME_TYPO = ('a @ w[f"h.{layer}.attn.c_proj.weight"]', 'a @ w[f"h.{layr}.attn.c_proj.weight"]')


class Terminal:
    """`theinference test --watch` in a 140x45 pseudo-terminal, its screen emulated."""

    def __init__(self, course: Path, stage: str, size: tuple[int, int] = (ROWS, COLS)):
        rows, cols = size
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.transcript = b""
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "theinference", "test", "--watch", "-C", str(course), "-s", stage, *SMALL_CASES],
            dimensions=(rows, cols),
            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols),
                 "LINES": str(rows)},
        )

    def pump(self, seconds: float = 0.2) -> None:
        try:
            chunk = self.child.read_nonblocking(1 << 16, timeout=seconds)
        except (pexpect.TIMEOUT, pexpect.EOF):
            return
        self.transcript += chunk
        self.stream.feed(chunk)

    def next_screen(self, drawn_before: int, timeout: float = 240) -> list[str]:
        """The screen once a run newer than `drawn_before` runs has been drawn in full."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if self.transcript.count(DRAWN) > drawn_before:
                self.pump(0.3)  # the rest of that draw
                return self.lines()
        raise AssertionError("no new screen; it shows:\n" + "\n".join(self.lines()))

    def drawn(self) -> int:
        return self.transcript.count(DRAWN)

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display if line.strip()]

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def terminal(weights):
    made = []

    def start(course: Path, stage: str, size: tuple[int, int] = (ROWS, COLS)) -> Terminal:
        made.append(Terminal(course, stage, size))
        return made[-1]

    yield start
    for t in made:
        t.close()


def bottom(lines: list[str], n: int = 8) -> str:
    return "\n".join(lines[-n:])


def edit(text: str, change: tuple[str, str]) -> str:
    old, new = change
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_each_classic_mistake_is_named_at_the_bottom_then_the_next_stage(tmp_path, terminal):
    """Would catch: a screen that scrolls the diagnosis away or shows a stale run, a bug named
    wrongly or not at all, errors without their lesson, Python's "Did you mean" lost, a passed
    stage that does not say what is next, and key n not moving the watcher on."""
    course = make_course(tmp_path / "course", reference_text())
    kvcache = course / "src" / "kvcache.py"
    term = terminal(course, "single-step-attention")
    first = term.next_screen(0)
    assert "PASSED" in bottom(first) and "next stage: build-prefill" in bottom(first)
    mistakes = [
        (edit(reference_text(), ATTEND_BEFORE_APPEND), "softmax got zero scores"),  # its lesson
        (planted("attend-old-length"), "suspected bug: attending over the old length"),
        (planted("causal-mask-in-step"), "suspected bug: a causal mask dragged into"),
        (planted("missing-scale"), "suspected bug: attention scores not scaled"),
        (edit(reference_text(), NAME_TYPO), "Did you mean: 'layer'?"),
    ]
    for text, named in mistakes:
        before = term.drawn()
        kvcache.write_text(text)
        screen = term.next_screen(before)
        assert "src/kvcache.py changed" in "\n".join(screen[:3]), "\n".join(screen)
        assert named in bottom(screen, 12), "\n".join(screen)
        assert "single-step-attention  PASSED" not in bottom(screen)
        assert "NOT PASSED" in bottom(screen)
    before = term.drawn()
    kvcache.write_text(reference_text())
    fixed = term.next_screen(before)
    assert "single-step-attention  PASSED" in bottom(fixed), "\n".join(fixed)
    assert "next stage: build-prefill" in bottom(fixed)
    before = term.drawn()
    term.child.send("n")
    moved = term.next_screen(before)
    assert "next stage: build-prefill" in "\n".join(moved[:3])
    assert "build-prefill  PASSED" in bottom(moved) and "full-decode-step" in bottom(moved)


def test_key_h_shows_the_stage_guidance_under_the_diagnosis(tmp_path, terminal):
    """Would catch: key h ignored, or showing another stage's text than the one in focus."""
    course = make_course(tmp_path / "course", planted("missing-scale"))
    term = terminal(course, "single-step-attention")
    term.next_screen(0)
    term.child.send("h")
    deadline = time.monotonic() + 60
    while b"hint: single-step-attention" not in term.transcript:
        assert time.monotonic() < deadline, "\n".join(term.lines())
        term.pump()
    term.pump(0.5)
    assert "1/sqrt(64)" in "\n".join(term.lines())


def test_at_80x24_the_header_and_the_failing_stage_stay_on_screen(tmp_path, terminal):
    """Would catch a failure's screen at 80x24 scrolling its header and stage line off the top
    (the first failing case's detail printed whole instead of cut to fit), or the guidance of
    key h hard-wrapped at 95 columns and wrapped again at 80, a short tail under each line."""
    course = make_course(tmp_path / "course", planted("attend-old-length"))
    term = terminal(course, "single-step-attention", size=(24, 80))
    screen = term.next_screen(0)
    shown = "\n".join(screen)
    assert screen[0].startswith("theinference · course"), shown
    assert any(line.startswith("✗ single-step-attention") for line in screen[:6]), shown
    assert "suspected bug: attending over the old length" in shown
    assert "more lines: `theinference test --stage single-step-attention`" in shown
    term.child.send("h")
    deadline = time.monotonic() + 60
    while b"your last run: suspected bug" not in term.transcript:
        assert time.monotonic() < deadline, "\n".join(term.lines())
        term.pump()
    term.pump(0.5)
    rows = [line.rstrip() for line in term.screen.display]
    guidance = rows[: next(i for i, row in enumerate(rows) if row.startswith("your last run"))]
    tails = [row for row, after in zip(guidance, guidance[1:], strict=False)
             if row and after and len(row) < 40 and not after.startswith("- ")]
    assert not tails, "\n".join(guidance)
