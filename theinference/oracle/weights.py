"""Find, make, check and map the checkpoint a run grades against.

Three sources, one result: `synthetic` (made locally on first use), `gpt2` (the real
openai-community/gpt2 through huggingface_hub) and a path to any GPT-2-family .safetensors.
Whatever the source, the student's process is handed a *canonical* file (exactly the GPT-2
tensors, float32, no `transformer.` prefix, no attention-mask buffers), so the template's
small loader never meets a layout it cannot read.

The oracle never reads that file while grading: it computes on a private copy, the whole
checkpoint read into the grader's own memory and hashed as read (private_copy.py; about 0.5 s
for 500 MB), so nothing written to the file later, in place and with its times put back or not,
can move the oracle's answers, and a synthetic file altered since it was made is noticed on the
next load and made again. Where the run is given a memo of digests the student's process can
neither read nor write (grading/digests.py), a file whose StatKey the memo knows is not read
up front: its tensors are read on first use, and must hash to the digest the memo gave.
"""

import fcntl
import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from theinference.atomic import atomic_file
from theinference.oracle import synthetic
from theinference.oracle.checkpoint import (
    WeightsError,
    canonicalise,
    check_shapes,
    infer_config,
    is_canonical,
)
from theinference.oracle.config import ModelConfig
from theinference.oracle.hub import HubUnavailable, hub_file
from theinference.oracle.private_copy import (
    ROWS_ALONE,
    DigestMemo,
    Digests,
    PrivateRead,
    PrivateTensors,
    part_digests,
    read_private,
    row_digests,
    stat_key,
)
from theinference.oracle.safetensors_io import SafetensorsError, map_tensors, tensors_in, write_file


def print_nothing(_message: str) -> None:
    """The default listener for a wait while the weights are made: nobody."""


HF_REPO = "openai-community/gpt2"
# pinned: a re-upload of the repository cannot move the oracle under a course
HF_REVISION = "607a30d783dfa663caf39e06633721c8d4cfcd7e"
HF_FILENAME = "model.safetensors"


@dataclass(frozen=True)
class Weights:
    name: str  # "synthetic", "gpt2" or the path the user gave
    path: Path  # the canonical float32 file the student's process reads
    sha256: str
    config: ModelConfig
    tensors: PrivateTensors  # the grader's private read-only copy, hashed as read
    notes: tuple[str, ...] = ()  # e.g. an altered cached file that was made again

    @property
    def short_hash(self) -> str:
        return self.sha256[:12]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.short_hash})"


def cache_dir() -> Path:
    """Where generated weights and cached answers live: never inside a course directory."""
    root = os.environ.get("THEINFERENCE_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "theinference"


def load_weights(
    spec: str, base_dir: Path, making: Callable[[str], None] = print_nothing,
    memo: DigestMemo | None = None,
) -> Weights:
    """Resolve a `--weights` value (synthetic | gpt2 | path) to checked weights. `making` is
    told, before the wait, when the synthetic checkpoint has to be made; `memo`, digests of
    files read before (see the module's docstring)."""
    if spec == "synthetic":
        path, read, known, notes = _verified_synthetic(making, memo)
        return _open(spec, path, read, known, memo, notes)
    if spec == "gpt2":
        return _open_user_file("gpt2", download_gpt2(), memo)
    path = (base_dir / spec).expanduser()
    if not path.is_file():
        raise WeightsError(
            f"weights file {path} does not exist (use 'synthetic', 'gpt2' or a .safetensors path)"
        )
    return _open_user_file(spec, path, memo)


def _memo_says(path: Path, memo: DigestMemo | None) -> Digests | None:
    """The digests `memo` holds for the file as it is now, if any."""
    try:
        return memo.known(stat_key(path)) if memo is not None else None
    except OSError:
        return None


# --- synthetic -------------------------------------------------------------------------------


def _verified_synthetic(
    making: Callable[[str], None], memo: DigestMemo | None
) -> tuple[Path, PrivateRead | None, Digests | None, tuple[str, ...]]:
    """The synthetic file; its bytes as read and hashed, or (read None) the digests the memo
    holds for them intact; and a note if it had to be remade (absent is normal; present with
    other bytes means something altered it)."""
    path = cache_dir() / f"synthetic-gpt2-124m-v{synthetic.SYNTHETIC_VERSION}.safetensors"
    known = _memo_says(path, memo)
    if known is not None and known.get("sha256") == synthetic.SYNTHETIC_SHA256:
        return path, None, known, ()
    read = _read_if_intact(path)
    if read is not None:
        return path, read, None, ()
    with _locked(path):
        read = _read_if_intact(path)  # another grader may have made it while we waited
        if read is not None:
            return path, read, None, ()
        altered = path.exists()
        making(f"making the synthetic GPT-2 weights in {path.parent} (once; about 10 s)")
        path.unlink(missing_ok=True)
        _write_atomically(path, synthetic.synthetic_tensors(), synthetic.SYNTHETIC_SHA256)
        read = _read_if_intact(path)
    if read is None:
        raise WeightsError(f"{path} changed while it was being made: is another program writing?")
    note = f"the synthetic weights in {path.parent} had been altered: they were made again"
    return path, read, None, (note,) if altered else ()


def _read_if_intact(path: Path) -> PrivateRead | None:
    try:
        read = read_private(path)
    except OSError:
        return None
    return read if read.sha256 == synthetic.SYNTHETIC_SHA256 else None


# --- real GPT-2 through the Hub --------------------------------------------------------------


def download_gpt2() -> Path:
    """openai-community/gpt2 at a pinned revision, from the Hugging Face cache when present;
    with no network, said at once (hub.py), never after the hub client's retries."""
    try:
        return hub_file(HF_REPO, HF_FILENAME, HF_REVISION)
    except HubUnavailable as reason:
        raise WeightsError(
            f"could not get {HF_REPO}/{HF_FILENAME} (revision {HF_REVISION[:8]}): {reason}\n"
            "Use --weights synthetic (the built-in default, made locally), or download the file "
            "elsewhere and pass its path with --weights path/to/model.safetensors."
        ) from None


# --- a user's file ---------------------------------------------------------------------------


def _open_user_file(name: str, path: Path, memo: DigestMemo | None) -> Weights:
    """Check a user's checkpoint; hand over a canonical copy if its layout is not canonical.
    A canonical file the memo knows is read on first use only."""
    if (known := _memo_says(path, memo)) is not None and _is_canonical_file(path):
        return _open(name, path, None, known, memo)
    try:
        read = read_private(path)
        tensors, digest = tensors_in(read.buffer, path), read.sha256
    except SafetensorsError as exc:
        raise WeightsError(str(exc)) from None
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc.strerror}") from None
    canonical = canonicalise(tensors)
    config = infer_config(canonical, path)
    check_shapes(canonical, config, path)
    if is_canonical(tensors, canonical):
        _learn(memo, read)
        return Weights(name, path.resolve(), digest, config, PrivateTensors(path, digest, tensors))
    copy = cache_dir() / f"canonical-{digest[:16]}.safetensors"
    notes = ()
    if not _holds(copy, canonical):
        with _locked(copy):
            if not _holds(copy, canonical):
                notes = (f"{copy} had been altered: it was made again",) if copy.exists() else ()
                copy.unlink(missing_ok=True)
                _write_atomically(copy, canonical)
    return Weights(name, copy.resolve(), digest, config,
                   PrivateTensors(copy, digest, canonical), notes)


def _holds(copy: Path, canonical: dict[str, np.ndarray]) -> bool:
    """The student's canonical copy holds exactly the tensors the oracle uses."""
    try:
        mapped = map_tensors(copy)
    except (SafetensorsError, OSError):
        return False
    return mapped.keys() == canonical.keys() and all(
        np.array_equal(mapped[k], canonical[k]) for k in canonical
    )


# --- shared plumbing -------------------------------------------------------------------------


def _is_canonical_file(path: Path) -> bool:
    try:
        mapped = map_tensors(path)  # the header read, no tensor's bytes
    except (SafetensorsError, OSError):
        return False
    return is_canonical(mapped, canonicalise(mapped))


def _open(name: str, path: Path, read: PrivateRead | None, known: Digests | None,
          memo: DigestMemo | None, notes=()) -> Weights:
    """The weights, their config and shapes checked: from `read` (the whole file, read and
    hashed; the memo learns its digests), or, where the memo `known` them, from the file's
    header, each tensor then read on first use and checked against its digest."""
    try:
        tensors = tensors_in(read.buffer, path) if read is not None else map_tensors(path)
    except (SafetensorsError, OSError) as exc:
        raise WeightsError(f"cannot read weights {path}: {exc}") from None
    config = infer_config(tensors, path)
    check_shapes(tensors, config, path)
    if read is not None:
        _learn(memo, read)
        private = PrivateTensors(path, read.sha256, tensors)
    else:
        parts, rows = known.get("parts") or {}, known.get("rows") or {}
        if not all(name in rows for name in ROWS_ALONE if name in tensors):
            parts = {}  # learned before rows were: read whole once more, both learned then
        whole = None if parts else functools.partial(_learn, memo)  # the parts learned then
        private = PrivateTensors(path, known["sha256"], parts=parts, read_whole=whole, rows=rows)
    return Weights(name, path.resolve(), private.sha256, config, private, tuple(notes))


def _learn(memo: DigestMemo | None, read: PrivateRead,
           tensors: dict[str, np.ndarray] | None = None) -> None:
    """The memo told the digest of a file read whole while nothing wrote to it, and given its
    `tensors`, theirs (a second pass over the bytes: paid by a run that reads a known file
    whole, so a run in a fresh cache, which reads it once, does not)."""
    if memo is not None and read.key is not None:
        parts = part_digests(tensors) if tensors is not None else {}
        rows = row_digests(read.buffer, Path(read.key[0])) if tensors is not None else {}
        memo.learn(read.key, {"sha256": read.sha256, "parts": parts, "rows": rows})


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path`, so concurrent graders make a file once."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "w")  # noqa: SIM115 (held across yield)
    except OSError as exc:
        raise WeightsError(f"cannot use the cache directory {path.parent}: {exc}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write_atomically(path: Path, tensors: dict[str, np.ndarray], sha256: str | None = None):
    """Write under a temporary name, check, then move into place (read-only): a half-written
    or unexpected file is never used."""
    try:
        with atomic_file(path, mode=0o444) as tmp:
            write_file(tmp, tensors)
            if sha256 is not None and _sha256_of(tmp) != sha256:
                raise WeightsError(
                    f"generated synthetic weights do not match their recorded sha256 "
                    f"{sha256[:12]}; this NumPy build computes differently, please report it"
                )
    except OSError as exc:
        raise WeightsError(f"cannot write {path}: {exc.strerror} (is the disk full?)") from None
