"""Read .safetensors files as read-only memory maps, checking the header before trusting it.

safetensors' own NumPy loader copies every tensor into memory; a 500 MB checkpoint read on
every run would cost seconds. The format is simple (8-byte little-endian header length, a JSON
header of name -> dtype/shape/offsets, then raw little-endian data), so we map it ourselves and
validate every offset against the file size.
"""

import json
import struct
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(Exception):
    """The file is not a readable safetensors checkpoint; the message says why."""


def read_header(path: Path) -> tuple[dict, int]:
    """Return (tensor entries, offset of the data section); raise SafetensorsError if malformed."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SafetensorsError(f"{path} is {size} bytes: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise SafetensorsError(f"{path} is not a safetensors file (bad header length)")
        raw = f.read(header_len)
    return parse_header(path, raw, size)


def parse_header(path: Path, raw: bytes, size: int) -> tuple[dict, int]:
    """The JSON header `raw` of a `size`-byte file, every entry checked against that size."""
    header_len = len(raw)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SafetensorsError(f"{path} is not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path} is not a safetensors file (header is not an object)")
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    for name, entry in header.items():
        _check_entry(path, name, entry, size - data_start)
    return header, data_start


def _check_entry(path: Path, name: str, entry: object, data_size: int) -> None:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise SafetensorsError(f"{path}: tensor {name!r} has a malformed header entry")
    begin, end = entry["data_offsets"]
    if entry["dtype"] not in DTYPES:
        raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {entry['dtype']}")
    if not 0 <= begin <= end <= data_size:
        raise SafetensorsError(
            f"{path}: tensor {name!r} lies past the end of the file (truncated download?)"
        )
    itemsize = 2 if entry["dtype"] in ("F16", "BF16") else np.dtype(DTYPES[entry["dtype"]]).itemsize
    if int(np.prod(entry["shape"], dtype=np.int64)) * itemsize != end - begin:
        raise SafetensorsError(f"{path}: tensor {name!r} size does not match its shape")


def map_tensors(path: Path) -> dict[str, np.ndarray]:
    """Memory-map every tensor read-only (F32/F64 mapped, F16/BF16 converted to float32)."""
    header, data_start = read_header(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = mapped[data_start + begin : data_start + end]
        tensors[name] = decode(raw, entry["dtype"]).reshape(entry["shape"])
    return tensors


def header_in(buffer: np.ndarray, path: Path) -> tuple[dict, int]:
    """(tensor entries, offset of the data section) of a whole file held in `buffer`."""
    if buffer.size < 8:
        raise SafetensorsError(f"{path} is {buffer.size} bytes: too short to be a safetensors file")
    (header_len,) = struct.unpack("<Q", buffer[:8].tobytes())
    if header_len > min(MAX_HEADER_BYTES, buffer.size - 8):
        raise SafetensorsError(f"{path} is not a safetensors file (bad header length)")
    return parse_header(path, buffer[8 : 8 + header_len].tobytes(), buffer.size)


def tensors_in(buffer: np.ndarray, path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a whole safetensors file held in `buffer` ([size] uint8), as views."""
    header, data_start = header_in(buffer, path)
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw_tensor = buffer[data_start + begin : data_start + end]
        tensors[name] = decode(raw_tensor, entry["dtype"]).reshape(entry["shape"])
    return tensors


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        halves = raw.view("<u2").astype(np.uint32) << 16
        return halves.view(np.float32)
    return raw.view(np.dtype(DTYPES[dtype]).newbyteorder("<"))


def write_file(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write float32 tensors as safetensors with a byte-stable layout (names sorted, header
    padded to 8 bytes), so the same tensors always give the same file and the same sha256."""
    entries, offset = {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].size * 4
        entries[name] = {
            "dtype": "F32",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())
