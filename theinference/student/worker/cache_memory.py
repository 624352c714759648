"""The memory a cache's floats may live in, inside the student's process (part of the worker:
imports nothing of the grader): NumPy arrays (a complex one's real and imaginary parts, a
structured one's float fields, 4-byte integers by their bits), PyTorch tensors (bfloat16 by its
bits), JAX arrays (their CPU buffers), `array.array`, ctypes float arrays, raw bytes read as
float32 (bytearray, memoryview, BytesIO, shared memory's buffer) and lists of Python floats, each
as arrays sharing it (a list's as a copy, put back once written).
"""


class Source:
    """One float array reachable from the cache, read and written in its own dtype: a NumPy
    array, or a PyTorch bfloat16 tensor's bits (`bf16`); where it is a copy (of a list of
    Python floats), `commit()` puts what was written back where the values live. `parameter`:
    a PyTorch module's parameter (a weight, initialised or loaded, where its shape is one)."""

    def __init__(self, array, bf16: bool = False, commit=None, parameter: bool = False):
        self.array, self.bf16, self.commit = array, bf16, commit
        self.parameter = parameter

    def decode(self, rows):
        import numpy as np

        if self.bf16:  # the upper half of a float32's bits
            return (rows.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return rows


def as_sources(obj) -> "list[Source] | None":
    """obj's float memory, as arrays sharing it (a copy only of a list of Python floats), or
    None when obj is no memory of numbers (its children are walked instead): NumPy arrays
    (a complex one's real and imaginary parts, a structured one's float fields, 4-byte
    integers by their bits as float32), PyTorch tensors (a bfloat16 one by its bits), JAX
    arrays, `array.array`, ctypes float arrays, and raw bytes (bytearray, memoryview, BytesIO:
    shared memory's buffer included) read as float32."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return None if obj.dtype.kind == "O" else array_sources(obj)
    if type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "detach"):
        source = torch_source(obj)
        return [source] if source is not None else []
    if type(obj).__module__.split(".")[0] in ("jax", "jaxlib") and hasattr(obj, "ndim"):
        source = jax_source(obj)
        return [source] if source is not None else []
    if type(obj) is list and float_list(obj):
        copy = np.array(obj, dtype=np.float64)
        return [Source(copy, commit=lambda: obj.__setitem__(slice(None), copy.tolist()))]
    raw = raw_memory(obj)
    if raw is None:
        return None
    try:
        a = np.asarray(raw)
        if a.dtype.itemsize == 1:  # raw bytes: float32 memory, when it can be
            a = a.reshape(-1).view(np.float32) if a.size % 4 == 0 and a.ndim <= 1 else None
    except (TypeError, ValueError):
        return []
    return array_sources(a) if a is not None and a.dtype.kind in "fciu" else []


def array_sources(a) -> list:
    """The float views of a NumPy array's memory (see as_sources)."""
    import numpy as np

    if a.dtype.fields:
        return [s for name in a.dtype.names for s in array_sources(a[name])]
    if a.dtype.kind == "c":
        return [Source(a.real), Source(a.imag)]
    if a.dtype.kind in "iu" and a.dtype.itemsize == 4:
        return [Source(a.view(np.float32))]
    return [Source(a)]


def float_list(obj: list) -> bool:
    """A list of Python floats that could hold rows (a multiple of 64 long)."""
    return len(obj) >= 64 and len(obj) % 64 == 0 and all(type(x) is float for x in obj)


def raw_memory(obj):
    """What np.asarray can read obj's memory through, sharing it, or None for no memory."""
    import array
    import ctypes
    import io

    # not an mmap object itself: the weights file's, mapped whole, would be read as floats; a
    # cache kept in one is reached through its memoryview or the arrays viewing it
    if isinstance(obj, (array.array, memoryview, bytearray)):
        return obj
    if isinstance(obj, ctypes.Array):
        return obj if obj._type_ in (ctypes.c_float, ctypes.c_double) else None
    if isinstance(obj, io.BytesIO):
        return obj.getbuffer()
    return None


def torch_source(tensor) -> "Source | None":
    parameter = type(tensor).__name__ == "Parameter"
    try:
        t = tensor.detach()
        if str(t.dtype) == "torch.bfloat16":
            import torch

            return Source(t.view(torch.int16).numpy(), bf16=True, parameter=parameter)
        return Source(t.numpy(), parameter=parameter)
    except Exception:  # noqa: BLE001 (on another device, sparse, ...: not readable here)
        return None


def jax_source(array) -> "Source | None":
    """A JAX array's buffer on its CPU device, as a NumPy array sharing it (a bfloat16 one by
    its bits): JAX's arrays are immutable to the program, not the memory under them, which
    every later operation on the array reads. None where it has no one buffer here (another
    device, sharded, deleted by a donation)."""
    import ctypes

    import numpy as np

    try:
        bf16 = str(array.dtype) == "bfloat16"
        dtype = np.dtype(np.int16) if bf16 else np.dtype(str(array.dtype))
        if dtype.kind != "f" and not bf16:
            return None
        memory = (ctypes.c_char * (array.size * dtype.itemsize)).from_address(
            array.unsafe_buffer_pointer()
        )
        memory.owner = array  # the buffer lives as long as the view of it
        # (no NumPy base under it: the buffer is read once, in the array's own shape)
        return Source(np.ndarray(array.shape, dtype, buffer=memory), bf16=bf16)
    except Exception:  # noqa: BLE001 (not a single buffer on this host)
        return None


def base_of(source: Source) -> "Source | None":
    """The array a view was taken from (a preallocated buffer behind a sliced view)."""
    import numpy as np

    base = source.array.base
    if isinstance(base, np.ndarray) and base.dtype == source.array.dtype:
        return Source(base, source.bf16)
    return None


def address(a) -> int:
    return a.__array_interface__["data"][0]
