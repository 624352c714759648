"""The exit codes, in one place (documented in README.md and docs/reference.md)."""

OK = 0  # every selected stage passed
NOT_PASSED = 1  # some stage failed, errored, timed out, is todo or was skipped
UNFINISHED = 1  # grade: the grader could not finish some submission (its row says why)
USAGE = 2  # bad command line (also Typer's own code for a bad option)
COURSE = 3  # not a course directory, or bad theinference.toml
WEIGHTS = 4  # weights missing, unreadable or malformed
INTERRUPTED = 130  # Ctrl-C


class Abort(Exception):
    """A user error found by a command itself: its message, and the exit code it means."""

    def __init__(self, message: str, code: int = USAGE):
        super().__init__(message)
        self.code = code
