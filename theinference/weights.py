"""Find, make, check and map the checkpoint a run grades against.

Three sources, one result: `synthetic` (made locally on first use), `gpt2` (the real
openai-community/gpt2 through huggingface_hub) and a path to any GPT-2-family .safetensors.
Whatever the source, the student's process is handed a *canonical* file (exactly the GPT-2
tensors, float32, no `transformer.` prefix, no attention-mask buffers), so the template's
small loader never meets a layout it cannot read.
"""

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from theinference import synthetic
from theinference.config import ModelConfig, expected_shapes
from theinference.safetensors_io import SafetensorsError, map_tensors, write_file

HF_REPO = "openai-community/gpt2"
# pinned: a re-upload of the repository cannot move the oracle under a course
HF_REVISION = "607a30d783dfa663caf39e06633721c8d4cfcd7e"
HF_FILENAME = "model.safetensors"
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not weights


class WeightsError(Exception):
    """The weights cannot be used; the message says why and what to do instead."""


@dataclass(frozen=True)
class Weights:
    name: str  # "synthetic", "gpt2" or the path the user gave
    path: Path  # the canonical float32 file the student's process reads
    sha256: str
    config: ModelConfig
    tensors: dict[str, np.ndarray]  # memory-mapped, read-only

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


def load_weights(spec: str, base_dir: Path) -> Weights:
    """Resolve a `--weights` value (synthetic | gpt2 | path) to mapped, checked weights."""
    if spec == "synthetic":
        path = synthetic_checkpoint()
        return _open(spec, path, synthetic.SYNTHETIC_SHA256)
    if spec == "gpt2":
        return _open_user_file("gpt2", download_gpt2())
    path = (base_dir / spec).expanduser()
    if not path.is_file():
        raise WeightsError(
            f"weights file {path} does not exist (use 'synthetic', 'gpt2' or a .safetensors path)"
        )
    return _open_user_file(spec, path)


# --- synthetic -------------------------------------------------------------------------------


def synthetic_checkpoint() -> Path:
    """The synthetic checkpoint's path, generating it once (under a lock, atomically)."""
    path = cache_dir() / f"synthetic-gpt2-124m-v{synthetic.SYNTHETIC_VERSION}.safetensors"
    if _intact(path):
        return path
    with _locked(path):
        if not _intact(path):  # another grader may have made it while we waited
            path.unlink(missing_ok=True)  # damaged or rewritten: make it again
            _write_atomically(path, synthetic.synthetic_tensors(), synthetic.SYNTHETIC_SHA256)
    return path


def _intact(path: Path) -> bool:
    """Present with its recorded bytes. Hashed once per (size, mtime), so a file rewritten
    after it was made (by anything, a student's code included) is noticed and replaced."""
    try:
        return path.exists() and file_sha256(path) == synthetic.SYNTHETIC_SHA256
    except OSError:
        return False


# --- real GPT-2 through the Hub --------------------------------------------------------------


def download_gpt2() -> Path:
    """openai-community/gpt2 at a pinned revision, from the Hugging Face cache when present."""
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(HF_REPO, HF_FILENAME, revision=HF_REVISION))
    except Exception as exc:  # the hub raises many types: offline, DNS, HTTP, missing cache
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(
            f"could not get {HF_REPO}/{HF_FILENAME} (revision {HF_REVISION[:8]}) from the "
            f"Hugging Face Hub or its local cache: {reason}\n"
            "Use --weights synthetic (the built-in default, made locally), or download the file "
            "elsewhere and pass its path with --weights path/to/model.safetensors."
        ) from None


# --- a user's file ---------------------------------------------------------------------------


def _open_user_file(name: str, path: Path) -> Weights:
    """Check a user's checkpoint; hand over a canonical copy if its layout is not canonical."""
    try:
        tensors = map_tensors(path)
    except SafetensorsError as exc:
        raise WeightsError(str(exc)) from None
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc.strerror}") from None
    canonical = canonicalise(tensors)
    config = infer_config(canonical, path)
    check_shapes(canonical, config, path)
    if _is_canonical(tensors, canonical):
        return _open(name, path, file_sha256(path))
    digest = file_sha256(path)
    copy = cache_dir() / f"canonical-{digest[:16]}.safetensors"
    if not copy.exists():
        with _locked(copy):
            if not copy.exists():
                _write_atomically(copy, {k: np.asarray(v) for k, v in canonical.items()})
    return _open(name, copy, digest)


def canonicalise(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Strip `transformer.`, drop mask buffers and the tied lm_head, make every tensor float32."""
    out = {}
    for key, value in tensors.items():
        name = key.removeprefix("transformer.")
        if name.endswith(BUFFER_SUFFIXES) or name == "lm_head.weight":
            continue
        if value.dtype != np.float32:
            value = value.astype(np.float32)
        out[name] = value
    return out


def _is_canonical(original: dict, canonical: dict) -> bool:
    return original.keys() == canonical.keys() and all(
        original[k].dtype == np.float32 for k in original
    )


def infer_config(tensors: dict[str, np.ndarray], path: Path) -> ModelConfig:
    """n_layer from the h.N blocks; n_embd, vocab and n_ctx from the embedding shapes."""
    for needed in ("wte.weight", "wpe.weight"):
        if needed not in tensors:
            raise WeightsError(f"{path}: missing tensor {needed!r}: is this a GPT-2 checkpoint?")
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"h\.(\d+)\.", k))}
    if not layers:
        raise WeightsError(f"{path}: no transformer blocks (h.0...) found")
    vocab, n_embd = tensors["wte.weight"].shape
    if tensors["wpe.weight"].ndim != 2 or n_embd % 64:
        raise WeightsError(f"{path}: embedding width {n_embd} is not a multiple of 64")
    return ModelConfig(
        n_layer=max(layers) + 1,
        n_embd=n_embd,
        vocab_size=vocab,
        n_ctx=tensors["wpe.weight"].shape[0],
    )


def check_shapes(tensors: dict[str, np.ndarray], config: ModelConfig, path: Path) -> None:
    """Every expected tensor present with its exact shape, and nothing else."""
    want = expected_shapes(config)
    missing = sorted(want.keys() - tensors.keys())
    extra = sorted(tensors.keys() - want.keys())
    if missing:
        raise WeightsError(f"{path}: missing tensor(s) {', '.join(missing[:5])}")
    if extra:
        raise WeightsError(f"{path}: unexpected tensor(s) {', '.join(extra[:5])}")
    for name, shape in want.items():
        if tuple(tensors[name].shape) != shape:
            raise WeightsError(
                f"{path}: tensor {name!r} has shape {list(tensors[name].shape)}, "
                f"expected {list(shape)}"
            )


# --- shared plumbing -------------------------------------------------------------------------


def _open(name: str, path: Path, sha256: str) -> Weights:
    try:
        tensors = map_tensors(path)
    except (SafetensorsError, OSError) as exc:
        raise WeightsError(f"cannot map weights {path}: {exc}") from None
    config = infer_config(tensors, path)
    check_shapes(tensors, config, path)
    return Weights(name=name, path=path.resolve(), sha256=sha256, config=config, tensors=tensors)


def file_sha256(path: Path) -> str:
    """sha256 of a file, memoised by (path, size, mtime) so a large file is hashed once."""
    known = _read_json(_hash_memo())
    return known.get(_memo_key(path)) or _remember_sha256(path, _sha256_of(path))


def _remember_sha256(path: Path, digest: str) -> str:
    known = _read_json(_hash_memo())
    known[_memo_key(path)] = digest
    _try_write_json(_hash_memo(), known)
    return digest


def _hash_memo() -> Path:
    return cache_dir() / "hashes.json"


def _memo_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _try_write_json(path: Path, data: dict) -> None:
    # a memo only: a full disk or read-only cache costs a re-hash next time, nothing more
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


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
    """Write to a temporary name, check, then rename: a half-written file is never used."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_file(tmp, tensors)
        digest = _sha256_of(tmp)
        if sha256 is not None and digest != sha256:
            raise WeightsError(
                f"generated synthetic weights do not match their recorded sha256 {sha256[:12]}; "
                "this NumPy build computes differently, please report it"
            )
        tmp.chmod(0o444)
        os.replace(tmp, path)
        _remember_sha256(path, digest)  # a rename keeps size and mtime: no second hashing
    except OSError as exc:
        raise WeightsError(f"cannot write {path}: {exc.strerror} (is the disk full?)") from None
    finally:
        tmp.unlink(missing_ok=True)
