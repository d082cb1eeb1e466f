"""Streaming access to safetensors files.

The safetensors library validates files, but its NumPy API cannot hand out
bfloat16 (NumPy has no such dtype) and it cannot write a file tensor by tensor.
MOSS weights are bf16 and several GB, so we let the library validate the file,
then read the header's byte offsets ourselves and memory-map or copy the bytes,
and we write shards by streaming: header first, then each tensor's bytes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..disk.sinks import appender
from ..errors import InputError

# storage dtype per safetensors dtype; bf16 is kept as its raw 16-bit pattern
STORAGE_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit
CHUNK_BYTES = 64 * 1024 * 1024

_CORRUPT_HINT = "the file is truncated or corrupt; download or copy it again"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def storage_dtype(self) -> np.dtype:
        return STORAGE_DTYPES[self.dtype]

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    def memmap(self, path: Path) -> np.ndarray:
        """The tensor's bytes as a read-only memmap in its storage dtype (bf16 → uint16)."""
        if self.nbytes == 0:
            return np.zeros(self.shape, dtype=self.storage_dtype)
        return np.memmap(
            path, dtype=self.storage_dtype, mode="r", offset=self.offset, shape=self.shape
        )


@dataclass(frozen=True)
class SafetensorsFile:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    size: int


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bf16 bit patterns to float32 exactly (bf16 is the top half of an f32)."""
    out = np.empty(bits.shape, dtype=np.float32)
    out.view(np.uint32)[...] = bits.astype(np.uint32) << 16
    return out


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return bf16_to_f32(raw)
    return np.asarray(raw, dtype=np.float32)


def read_header(path: Path) -> SafetensorsFile:
    """Parse and validate a safetensors header; raise InputError naming the file if bad."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InputError(
                    "not a safetensors file (shorter than 8 bytes)", path=path, hint=_CORRUPT_HINT
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise InputError(
                    f"bad safetensors header length {n} for a {size}-byte file",
                    path=path,
                    hint=_CORRUPT_HINT,
                )
            raw = f.read(n)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path=path) from exc
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        # RecursionError: a header of nested arrays deeper than the parser recurses
        raise InputError(
            f"safetensors header is not valid JSON ({str(exc)[:120]})", path=path,
            hint=_CORRUPT_HINT,
        ) from None
    if not isinstance(header, dict):
        raise InputError("safetensors header is not a JSON object", path=path, hint=_CORRUPT_HINT)
    data_start = 8 + n
    data_len = size - data_start
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise InputError("safetensors __metadata__ is not an object", path=path,
                         hint=_CORRUPT_HINT)  # fmt: skip
    tensors: dict[str, TensorInfo] = {}
    end_max = 0
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"malformed entry for tensor {name[:80]!r}", path=path, hint=_CORRUPT_HINT
            ) from exc
        if not isinstance(dtype, str) or dtype not in STORAGE_DTYPES:
            raise InputError(f"tensor {name[:80]!r} has unsupported dtype {str(dtype)[:20]}",
                             path=path)  # fmt: skip
        if any(d < 0 for d in shape):
            raise InputError(f"tensor {name[:80]!r} has a negative dimension in {list(shape)}",
                             path=path, hint=_CORRUPT_HINT)  # fmt: skip
        # Python's ints: a shape of 2^70 × 2^70 is refused below, not overflowed
        expected = math.prod(shape) * STORAGE_DTYPES[dtype].itemsize
        if begin < 0 or end < begin or end - begin != expected:
            raise InputError(
                f"tensor {name!r} has offsets {begin}..{end} that do not fit its "
                f"shape {list(shape)}",
                path=path,
                hint=_CORRUPT_HINT,
            )
        if end > data_len:
            raise InputError(
                f"tensor {name!r} ends at byte {data_start + end}, past the end of "
                f"the {size}-byte file",
                path=path,
                hint=_CORRUPT_HINT,
            )
        end_max = max(end_max, end)
        tensors[name] = TensorInfo(name, dtype, shape, data_start + begin, end - begin)
    if end_max != data_len and tensors:
        raise InputError(
            f"{data_len - end_max} unexpected trailing bytes after the tensor data",
            path=path,
            hint=_CORRUPT_HINT,
        )
    _library_check(path)
    return SafetensorsFile(path, tensors, {str(k): str(v) for k, v in metadata.items()}, size)


def _library_check(path: Path) -> None:
    """Let the safetensors library itself validate what we parsed (overlaps, alignment...)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
    except (SafetensorError, OSError) as exc:
        raise InputError(f"rejected by safetensors: {exc}", path=path, hint=_CORRUPT_HINT) from exc


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to be written: its header entry and where its bytes come from."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    source: Path | None = None  # copy nbytes from source at source_offset ...
    source_offset: int = 0
    array: np.ndarray | None = None  # ... or write this array's bytes


def build_header(tensors: Iterable[PlannedTensor], metadata: dict[str, str] | None = None) -> bytes:
    header: dict = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep tensor data 8-byte aligned, as the format advises
    return struct.pack("<Q", len(blob)) + blob


def copy_into(sink, source: Path, offset: int, nbytes: int, on_bytes=None) -> None:
    """Append nbytes of source from offset to sink, in chunks through one reused buffer."""
    buf = bytearray(min(nbytes, CHUNK_BYTES) or 1)
    view = memoryview(buf)
    with open(source, "rb", buffering=0) as src:
        src.seek(offset)
        left = nbytes
        while left:
            got = src.readinto(view[: min(left, len(buf))])
            if not got:
                raise InputError(
                    f"unexpected end of file after {nbytes - left} bytes",
                    path=source,
                    hint=_CORRUPT_HINT,
                )
            sink.write(view[:got])
            left -= got
            if on_bytes:
                on_bytes(got)


def write_streaming(
    path: Path, tensors: list[PlannedTensor], metadata: dict[str, str] | None = None, on_bytes=None
) -> int:
    """Write a safetensors file tensor by tensor; returns the bytes written."""
    header = build_header(tensors, metadata)
    size = len(header) + sum(t.nbytes for t in tensors)
    with open(path, "wb+") as out:
        out.write(header)
        out.flush()
        with appender(out, path, len(header), size) as sink:
            for t in tensors:
                if t.array is not None:
                    sink.write(np.ascontiguousarray(t.array))
                    if on_bytes:
                        on_bytes(t.nbytes)
                else:
                    copy_into(sink, t.source, t.source_offset, t.nbytes, on_bytes)
    return size
