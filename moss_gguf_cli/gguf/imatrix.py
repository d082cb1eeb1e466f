"""Importance matrices (llama-imatrix's output), read the way llama-quantize reads them.

Both formats: the GGUF one (``<tensor>.in_sum2`` / ``.counts``) and the legacy ``.dat``.
The values and the ``quantize.imatrix.*`` keys they add feed the library engine
(quantize/llama.py) and the direct engine (quantize/direct.py) alike.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError


@dataclass
class ImatrixData:
    entries: dict[str, np.ndarray]  # tensor name -> float32 per-column importance
    datasets: list[str]
    chunk_count: int


def load_imatrix(path: Path) -> ImatrixData:
    """Read an importance matrix (GGUF or the legacy .dat) the way llama-quantize does."""
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    try:
        return _load_imatrix_gguf(path) if magic == b"GGUF" else _load_imatrix_legacy(path)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
        raise InputError(
            f"cannot read the importance matrix ({exc})",
            path=path,
            hint="pass an imatrix written by llama-imatrix",
        ) from None


def _load_imatrix_gguf(path: Path) -> ImatrixData:
    # gguf-py's reader, not gguf/read.py: what is needed here is tensor data (a small file),
    # which the header reader does not read
    import gguf

    reader = gguf.GGUFReader(path)
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        for suffix, into in ((".in_sum2", sums), (".counts", counts)):
            if t.name.endswith(suffix):
                if t.tensor_type != gguf.GGMLQuantizationType.F32:
                    raise InputError(f"{t.name} must be F32", path=path)
                into[t.name[: -len(suffix)]] = np.asarray(t.data, dtype=np.float32).reshape(-1)
    if not sums and not counts:
        raise InputError("importance matrix holds no data", path=path)

    def field_value(key: str) -> Any:
        f = reader.fields.get(key)
        return f.contents() if f is not None else None

    datasets = field_value("imatrix.datasets")
    chunk_count = field_value("imatrix.chunk_count")
    chunk_size = field_value("imatrix.chunk_size")
    if datasets is None or chunk_count is None or chunk_size is None:
        raise InputError(
            "importance matrix metadata missing (imatrix.datasets/chunk_count/chunk_size)",
            path=path,
            hint="regenerate it with llama-imatrix",
        )
    entries: dict[str, np.ndarray] = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            raise InputError(f"mismatched sums and counts for {name}", path=path)
        # std::lround: halves away from zero
        c = np.sign(counts[name]) * np.floor(np.abs(counts[name].astype(np.float64)) + 0.5)
        s = sums[name]
        ne0 = s.size // c.size
        e = np.ones(s.size, dtype=np.float32)
        for j, cnt in enumerate(c):
            if cnt > 0:
                e[j * ne0 : (j + 1) * ne0] = s[j * ne0 : (j + 1) * ne0] / np.float32(float(cnt))
        entries[name] = e
    if isinstance(datasets, str):
        datasets = [datasets]
    return ImatrixData(entries, [str(d) for d in datasets], int(chunk_count))


def _load_imatrix_legacy(path: Path) -> ImatrixData:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise InputError("truncated importance matrix", path=path)
        value = struct.unpack_from(fmt, data, pos)
        pos += size
        return value if len(value) > 1 else value[0]

    n_entries = take("<i")
    if n_entries < 1:
        raise InputError("not an importance matrix (no entries)", path=path)
    entries: dict[str, np.ndarray] = {}
    for _ in range(n_entries):
        n = take("<i")
        if n < 0 or pos + n > len(data):
            raise InputError("truncated importance matrix", path=path)
        name = data[pos : pos + n].split(b"\0")[0].decode("utf-8", "replace")
        pos += n
        ncall, nval = take("<i"), take("<i")
        if nval < 1 or pos + 4 * nval > len(data):
            raise InputError("truncated importance matrix", path=path)
        sums = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        entries[name] = sums / np.float32(ncall) if ncall > 0 else sums.copy()
    datasets: list[str] = []
    chunk_count = 0
    if pos + 4 <= len(data):
        chunk_count = take("<i")
        if pos + 4 <= len(data):
            n = take("<i")
            if n > 0 and pos + n <= len(data):
                datasets.append(data[pos : pos + n].split(b"\0")[0].decode("utf-8", "replace"))
    return ImatrixData(entries, datasets, chunk_count)


OVERRIDE_STR_BYTES = 127  # llama_model_kv_override's char[128] keeps this many bytes


def imatrix_kvs(data: ImatrixData, file_arg: str) -> list[tuple[str, int | str]]:
    """The quantize.imatrix.* keys llama-quantize adds, in its order."""
    kvs: list[tuple[str, int | str]] = [("quantize.imatrix.file", file_arg)]
    if data.datasets:
        kvs.append(("quantize.imatrix.dataset", data.datasets[0]))
    kvs.append(("quantize.imatrix.entries_count", len(data.entries)))
    if data.chunk_count > 0:
        kvs.append(("quantize.imatrix.chunks_count", data.chunk_count))
    return kvs
