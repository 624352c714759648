"""The student's exceptions, told in the student's terms: a traceback cut to their own files,
Python's "Did you mean" kept on every version. Part of the worker: imports nothing of the
grader."""

import os
import traceback

MEMORY_LIMIT = 0  # bytes, set at start-up by the worker


def describe_exception(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"the code called sys.exit({exc.code!r})"
    if isinstance(exc, KeyboardInterrupt):
        return "the code raised KeyboardInterrupt"
    if isinstance(exc, MemoryError):
        limit = f"{MEMORY_LIMIT / 2**30:g} GiB" if MEMORY_LIMIT else "none"
        return f"MemoryError: the code ran out of memory (the grader's limit: {limit})"
    text = str(exc)
    if (hint := suggestion(exc)) and "Did you mean" not in text:
        text += f". Did you mean: '{hint}'?"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def student_traceback(exc: BaseException, course_dir: str) -> str:
    """The traceback trimmed to frames in the course directory, paths made relative to it, each
    frame once, ending with Python's own message and its "Did you mean" suggestion."""
    root = os.path.realpath(course_dir) + os.sep
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if os.path.realpath(f.filename).startswith(root)
    ]
    lines = ["Traceback (your code, most recent call last):\n"] if frames else []
    for frame in frames:
        frame.filename = os.path.relpath(os.path.realpath(frame.filename), root)
    lines += traceback.format_list(frames)
    shown = traceback.TracebackException.from_exception(exc)
    if isinstance(exc, SyntaxError) and shown.filename:  # its own "File ..." line, shown once
        shown.filename = os.path.relpath(os.path.realpath(shown.filename), root)
    last = list(shown.format_exception_only())
    if last and (hint := suggestion(exc)) and "Did you mean" not in last[-1]:
        last[-1] = last[-1].rstrip("\n") + f". Did you mean: '{hint}'?\n"
    return "".join(lines + last)


def suggestion(exc: BaseException) -> str | None:
    """Python 3.12 puts "Did you mean" into the traceback module's text; 3.11 prints it only
    from the interpreter's own hook. The same idea: the closest name that exists."""
    import difflib

    missing = getattr(exc, "name", None)
    if not isinstance(missing, str) or not isinstance(exc, (NameError, AttributeError)):
        return None
    if isinstance(exc, AttributeError):
        try:
            known = dir(exc.obj)
        except Exception:  # noqa: BLE001 (an object whose __dir__ raises)
            return None
    else:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        frame = tb.tb_frame if tb is not None else None
        known = [*frame.f_locals, *frame.f_globals, *dir(__builtins__)] if frame else []
    close = difflib.get_close_matches(missing, [k for k in known if k != missing], n=1)
    return close[0] if close else None
