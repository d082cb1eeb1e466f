"""The GGUF header, one reader for every user: verify, quantize, layout, preconverted, `all`.

Parsed here rather than with ``gguf.GGUFReader``, which builds a Python object for every one
of the ~300k tokenizer array entries (16 s for the tiny model's header on the 2-core test
machine, against 0.1 s here). Arrays are skipped, not decoded (:meth:`GgufFile.strings` reads
chosen items); tensor data is not touched. docs/ARCHITECTURE.md §4.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError

# GGUF value types: struct formats of the scalars; 8 is a string, 9 an array
_SCALARS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


class GgufFormatError(Exception):
    """What is wrong with a header. kind: magic | version | truncated | type | damaged;
    what: the version (kind version), the (tensor name, type id) (kind type)."""

    def __init__(self, message: str, kind: str = "damaged", what: Any = None) -> None:
        super().__init__(message)
        self.kind, self.what = kind, what


@dataclass(frozen=True)
class GgufArray:
    """An array value, not decoded: its item type, length and where its items start."""

    itype: int
    count: int
    offset: int


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length
    type_name: str
    offset: int  # from the start of the data section

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def n_rows(self) -> int:
        return math.prod(self.dims[1:]) if len(self.dims) > 1 else 1

    @property
    def row_bytes(self) -> int:
        import gguf

        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.type_name]]
        return self.dims[0] // block * size

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.n_rows


@dataclass
class GgufFile:
    path: Path
    size: int
    version: int
    endian: str
    kv: dict[str, Any]
    tensors: dict[str, GgufTensorInfo]
    data_offset: int
    alignment: int

    @property
    def data_end(self) -> int:
        ends = [t.offset + t.nbytes for t in self.tensors.values()]
        return self.data_offset + max(ends, default=0)

    @property
    def arch(self) -> str | None:
        value = self.kv.get("general.architecture")
        return value if isinstance(value, str) else None

    def abs_offset(self, t: GgufTensorInfo) -> int:
        return self.data_offset + t.offset

    def in_file(self, t: GgufTensorInfo) -> bool:
        return self.abs_offset(t) + t.nbytes <= self.size

    def strings(self, key: str, wanted: Iterable[int] = ()) -> dict[int, str]:
        """Items of a string array (only the indices in WANTED), read from the file."""
        arr = self.kv.get(key)
        want = set(wanted)
        if not isinstance(arr, GgufArray) or arr.itype != _STRING or not want:
            return {}
        out: dict[int, str] = {}
        last = max(want)
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = arr.offset
            fmt = self.endian + "Q"
            for i in range(min(arr.count, last + 1)):
                (n,) = struct.unpack_from(fmt, mm, pos)
                if i in want:
                    out[i] = mm[pos + 8 : pos + 8 + n].decode("utf-8", "replace")
                pos += 8 + n
        return out

    def array(self, key: str) -> list | None:
        """A whole array of strings or scalars, read from the file; None: no such array."""
        arr = self.kv.get(key)
        if not isinstance(arr, GgufArray) or arr.itype not in (*_SCALARS, _STRING):
            return None
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if arr.itype in _SCALARS:
                fmt = f"{self.endian}{arr.count}{_SCALARS[arr.itype]}"
                return list(struct.unpack_from(fmt, mm, arr.offset))
            out, pos, fmt = [], arr.offset, self.endian + "Q"
            for _ in range(arr.count):
                (n,) = struct.unpack_from(fmt, mm, pos)
                out.append(mm[pos + 8 : pos + 8 + n].decode("utf-8", "replace"))
                pos += 8 + n
            return out


class _Header:
    """A cursor over a memory-mapped GGUF header."""

    def __init__(self, mm: mmap.mmap, size: int, endian: str) -> None:
        self.mm, self.size, self.endian, self.pos = mm, size, endian, 8

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(self.endian + fmt, self.mm, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > self.size:
            raise GgufFormatError("header ends inside a string", "truncated")
        s = self.mm[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def skip_array(self, itype: int, count: int) -> None:
        if itype in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[itype])
        elif itype == _STRING:
            fmt = self.endian + "Q"
            for _ in range(count):
                self.pos += 8 + struct.unpack_from(fmt, self.mm, self.pos)[0]
        elif itype == _ARRAY:  # an array of arrays
            for _ in range(count):
                self.skip_array(self.take("I"), self.take("Q"))
        else:
            raise GgufFormatError(f"unsupported array item type {itype}")
        if self.pos > self.size:
            raise GgufFormatError("header ends inside an array", "truncated")

    def key_values(self, n_kv: int) -> dict[str, Any]:
        kv: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self.string()
            vtype = self.take("I")
            if vtype in _SCALARS:
                kv[key] = self.take(_SCALARS[vtype])
            elif vtype == _STRING:
                kv[key] = self.string()
            elif vtype == _ARRAY:
                itype, count = self.take("I"), self.take("Q")
                kv[key] = GgufArray(itype, count, self.pos)
                self.skip_array(itype, count)
            else:
                raise GgufFormatError(f"key {key!r} has unknown value type {vtype}")
        return kv

    def tensor_infos(self, n_tensors: int) -> dict[str, GgufTensorInfo]:
        import gguf

        tensors: dict[str, GgufTensorInfo] = {}
        for _ in range(n_tensors):
            name = self.string()
            n_dims = self.take("I")
            if n_dims > 8:
                raise GgufFormatError(f"tensor {name!r} has {n_dims} dimensions")
            dims = tuple(self.take("Q") for _ in range(n_dims))
            type_id, offset = self.take("I"), self.take("Q")
            try:
                qtype = gguf.GGMLQuantizationType(type_id)
            except ValueError:
                raise GgufFormatError(
                    f"tensor {name!r} has unknown type id {type_id}", "type", (name, type_id)
                ) from None
            block = gguf.GGML_QUANT_SIZES[qtype][0]
            if not dims or dims[0] % block:
                raise GgufFormatError(
                    f"tensor {name!r}: row length {dims[:1]} does not split into "
                    f"{qtype.name} blocks of {block}"
                )
            tensors[name] = GgufTensorInfo(name, dims, qtype.name, offset)
        return tensors


def _magic(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def read_gguf(path: Path) -> GgufFile:
    """Parse a GGUF header (key/values with arrays skipped, tensor infos); GgufFormatError
    names what is wrong (its kind says which way). Tensor data is not touched."""
    size = path.stat().st_size
    if size < 24:
        kind = "truncated" if _magic(path) == b"GGUF" else "magic"
        raise GgufFormatError(f"only {size} bytes: not a GGUF", kind)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise GgufFormatError("bad magic bytes: not a GGUF file", "magic")
        version = struct.unpack_from("<I", mm, 4)[0]
        endian = "<"
        if version & 0xFFFF == 0:  # a big-endian file
            version, endian = struct.unpack_from(">I", mm, 4)[0], ">"
        if version not in (2, 3):
            raise GgufFormatError(f"unsupported GGUF version {version}", "version", version)
        h = _Header(mm, size, endian)
        try:
            n_tensors, n_kv = h.take("Q"), h.take("Q")
            if n_tensors > 1 << 24 or n_kv > 1 << 24:
                raise GgufFormatError(f"implausible counts ({n_tensors} tensors, {n_kv} keys)")
            kv = h.key_values(n_kv)
            tensors = h.tensor_infos(n_tensors)
        except (struct.error, IndexError):
            raise GgufFormatError(f"the header ends early ({size} bytes)", "truncated") from None
        align = kv.get("general.alignment", 32)
        align = align if isinstance(align, int) and align > 0 else 32
        data_offset = -(-h.pos // align) * align
    return GgufFile(path, size, version, endian, kv, tensors, data_offset, align)


def file_type_name(g: GgufFile) -> str | None:
    import gguf

    value = g.kv.get("general.file_type")
    if not isinstance(value, int):
        return None
    try:
        return gguf.LlamaFileType(value).name
    except ValueError:
        return None


# ----------------------------------------------------------------------------- quantize's view

UNQUANTIZED_TENSOR_TYPES = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type: str  # ggml type name, e.g. "Q4_K"
    shape: tuple[int, ...]  # ggml order (ne0 first)
    n_bytes: int


@dataclass
class GgufInfo:
    """What the header says, and whether the file is long enough for its tensor data."""

    path: Path
    version: int
    n_tensors: int
    architecture: str | None
    file_type: int | None
    tensor_types: Counter = field(default_factory=Counter)
    tensors: dict[str, GgufTensor] = field(default_factory=dict)
    n_elements: int = 0
    data_offset: int = 0
    data_end: int = 0  # bytes the file must hold
    size: int = 0

    @property
    def quantized_types(self) -> list[str]:
        return sorted(t for t in self.tensor_types if t not in UNQUANTIZED_TENSOR_TYPES)


_REWRITE = "the file is incomplete; convert or copy it again"


def header_input_error(path: Path, exc: GgufFormatError) -> InputError:
    """A header problem as the one-line error a GGUF input gets (quantize, layout, `all`)."""
    if exc.kind == "magic":
        return InputError(
            "not a GGUF file (bad magic bytes)",
            path=path,
            hint="pass the f16 GGUF written by `moss-gguf convert`",
        )
    if exc.kind == "version" and exc.what < 2:
        return InputError(
            f"GGUF version {exc.what} is too old for llama.cpp",
            path=path,
            hint="convert the model again",
        )
    if exc.kind == "truncated":
        size = path.stat().st_size
        return InputError(
            f"truncated GGUF: the header ends early ({size} bytes)", path=path, hint=_REWRITE
        )
    if exc.kind == "type":
        name, type_id = exc.what
        return InputError(
            f"tensor {name!r} has an unknown type id {type_id}",
            path=path,
            hint="update the gguf package or llama.cpp",
        )
    return InputError(f"damaged GGUF header ({exc})", path=path, hint="convert the model again")


def inspect_gguf(path: Path) -> GgufInfo:
    """Read a GGUF header; InputError if it is not a GGUF or is shorter than it claims."""
    path = Path(path)
    if not path.exists():
        raise InputError("input file not found", path=path, hint="check the path")
    if not path.is_file():
        raise InputError("input is not a file", path=path, hint="pass a .gguf file")
    try:
        g = read_gguf(path)
    except GgufFormatError as exc:
        raise header_input_error(path, exc) from None
    info = GgufInfo(
        path=path,
        version=g.version,
        n_tensors=len(g.tensors),
        architecture=g.kv.get("general.architecture"),
        file_type=g.kv.get("general.file_type"),
        size=g.size,
        data_offset=g.data_offset,
        data_end=g.data_end,
    )
    for t in g.tensors.values():
        info.tensors[t.name] = GgufTensor(t.name, t.type_name, t.dims, t.nbytes)
        info.tensor_types[t.type_name] += 1
        info.n_elements += t.n_elements
    if info.size < info.data_end:
        raise InputError(
            f"truncated GGUF: {info.size} bytes, its tensor data needs {info.data_end}",
            path=path,
            hint=_REWRITE,
        )
    return info
