"""One way to write a file so that no reader ever sees half of it: write beside it under a
temporary name, then move it into place (every file the grader writes goes through here)."""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_file(path: Path, mode: int | None = None, first_wins: bool = False) -> Iterator[Path]:
    """A temporary path beside `path` (made with mode 0600) for the caller to write; when the
    block ends without an error it is moved into place, else removed. `mode` (e.g. 0o444) is
    set before the move; `first_wins` keeps a file already there (another writer's) instead of
    replacing it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        if not first_wins:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another writer made it first: theirs stands
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """`data` written to `path` whole or not at all (see atomic_file)."""
    with atomic_file(path, mode) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
