"""Tensor data: dequantize GGUF rows, read source rows, and measure one against the other.

Tensor data is read with ``os.pread`` and dequantized with the ``gguf`` package's quant
classes in row blocks sized for the CPU cache, on every core.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..gguf.read import GgufFile, GgufTensorInfo
from ..gguf.write import ARCH, expected_shapes
from ..progress import ProgressReporter
from ..source.checkpoint import TensorRef
from ..source.safetensors_io import bf16_to_f32, to_f32
from .context import CHUNK_BYTES, WORKERS

# elements per dequantize call: K-quant dequantizing in NumPy is fastest with ~64-256k
# elements per call (temporaries stay in cache); gguf's own grouping of 16 rows is ~4x
# slower on 256-wide rows


# elements per dequantize call: K-quant dequantizing in NumPy is fastest with ~64-256k
# elements per call (temporaries stay in cache); gguf's own grouping of 16 rows is ~4x
# slower on 256-wide rows
_DEQUANT_ELEMS = 1 << 17


_BLOCK_ELEMS = 1 << 22  # elements per worker task when comparing with the source


def _quant_class(type_name: str):
    """gguf's quant class for a type (its dequantize_rows takes any number of rows)."""
    from gguf import quants

    cls = getattr(quants, type_name, None)
    if cls is None or not hasattr(cls, "dequantize_rows"):
        return None
    cls.init_grid()
    return cls


def dequantize_rows(raw: np.ndarray, type_name: str) -> np.ndarray:
    """(rows, row_bytes) uint8 → (rows, row_len) float32, with the gguf package."""
    import gguf

    if type_name == "F32":
        return raw.view(np.float32)
    if type_name == "F16":
        return raw.view(np.float16).astype(np.float32)
    if type_name == "BF16":
        return bf16_to_f32(raw.view(np.uint16))
    cls = _quant_class(type_name)
    if cls is not None:
        return cls.dequantize_rows(raw)
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])


SOURCE_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


def pread(fd: int, nbytes: int, offset: int) -> bytes:
    """Exactly nbytes at offset, or fewer if the file ends (the caller checks)."""
    parts = []
    while nbytes > 0:
        chunk = os.pread(fd, nbytes, offset)
        if not chunk:
            break
        parts.append(chunk)
        nbytes -= len(chunk)
        offset += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class Sums:
    """Σd², Σs², Σq², Σqs of a tensor compared block by block (float64 totals)."""

    def __init__(self) -> None:
        self.dd = self.ss = self.qq = self.qs = 0.0
        self.lock = threading.Lock()

    def add(self, q: np.ndarray, s: np.ndarray) -> None:
        q, s = q.reshape(-1), s.reshape(-1)
        d = q - s
        dd, ss, qq, qs = (float(np.dot(a, b)) for a, b in ((d, d), (s, s), (q, q), (q, s)))
        with self.lock:
            self.dd += dd
            self.ss += ss
            self.qq += qq
            self.qs += qs

    def result(self) -> tuple[float, float]:
        """(relative RMSE, cosine similarity)."""
        if self.ss == 0:
            rel = 0.0 if self.dd == 0 else math.inf
        else:
            rel = math.sqrt(self.dd / self.ss)
        denom = math.sqrt(self.qq * self.ss)
        cos = self.qs / denom if denom > 0 else (1.0 if self.dd == 0 else 0.0)
        return rel, cos


def compare_block(
    g_fd: int,
    g: GgufFile,
    t: GgufTensorInfo,
    row0: int,
    row1: int,
    source_rows: Callable[[int, int], np.ndarray],
    sums: Sums,
) -> None:
    """Dequantize GGUF rows [row0, row1) and add their comparison with the source rows."""
    n = row1 - row0
    raw = pread(g_fd, n * t.row_bytes, g.abs_offset(t) + row0 * t.row_bytes)
    q_all = np.frombuffer(raw, dtype=np.uint8).reshape(n, t.row_bytes)
    src = source_rows(row0, row1)
    step = max(1, _DEQUANT_ELEMS // t.dims[0])
    with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN become a failing figure
        for a in range(0, n, step):
            q = dequantize_rows(q_all[a : a + step], t.type_name)
            sums.add(q, src[a : a + step])


def row_reader(path: Path, offset: int, row_len: int, dtype: str, fd: int):
    """source_rows(row0, row1) → float32 rows of a row-major tensor stored at offset."""
    np_dtype = SOURCE_DTYPES[dtype]
    row_bytes = row_len * np_dtype.itemsize

    def read(row0: int, row1: int) -> np.ndarray:
        raw = pread(fd, (row1 - row0) * row_bytes, offset + row0 * row_bytes)
        if len(raw) != (row1 - row0) * row_bytes:
            raise InputError("tensor data ends early", path=path)
        arr = np.frombuffer(raw, dtype=np_dtype).reshape(row1 - row0, row_len)
        return to_f32(arr, dtype)

    return read


def _with_delta(read: Callable[[int, int], np.ndarray], ref: TensorRef):
    def merged(row0: int, row1: int) -> np.ndarray:
        return read(row0, row1) + ref.delta.rows(row0, row1 - row0)

    return merged


def compare_tensors(
    g: GgufFile, pairs: list[tuple[GgufTensorInfo, TensorRef]], progress: ProgressReporter
) -> list[tuple[GgufTensorInfo, TensorRef, float, float]]:
    """(tensor, source, rel. RMSE, cosine) for every pair; both cores, row blocks."""
    total = sum(t.n_elements for t, _ in pairs)
    progress.start(f"verify:compare:{g.path.name}", f"verify: {g.path.name} vs source", total, "")
    fds: dict[Path, int] = {}
    sums = {t.name: Sums() for t, _ in pairs}
    tasks = []
    for t, ref in pairs:
        per = max(1, _BLOCK_ELEMS // t.dims[0])
        for a in range(0, t.n_rows, per):
            tasks.append((t, ref, a, min(t.n_rows, a + per)))
    lock = threading.Lock()
    try:
        fds[g.path] = os.open(g.path, os.O_RDONLY)
        for _, ref in pairs:
            if ref.path not in fds:
                fds[ref.path] = os.open(ref.path, os.O_RDONLY)

        def work(task) -> None:
            t, ref, a, b = task
            read = row_reader(ref.path, ref.offset, t.dims[0], ref.dtype, fds[ref.path])
            if ref.delta is not None:  # a merged LoRA adapter: the source plus its update
                read = _with_delta(read, ref)
            compare_block(fds[g.path], g, t, a, b, read, sums[t.name])
            with lock:
                progress.advance(f"verify:compare:{g.path.name}", (b - a) * t.dims[0])

        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="verify") as pool:
            for _ in pool.map(work, tasks):
                pass
    finally:
        for fd in fds.values():
            os.close(fd)
        progress.finish(f"verify:compare:{g.path.name}")
    return [(t, ref, *sums[t.name].result()) for t, ref in pairs]


def same_bytes(a: Path, a_off: int, b: Path, b_off: int, n: int) -> bool:
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        fa.seek(a_off)
        fb.seek(b_off)
        while n > 0:
            step = min(n, CHUNK_BYTES)
            x, y = fa.read(step), fb.read(step)
            if x != y or len(x) != step:
                return False
            n -= step
    return True


def moss_source_name(hf_name: str) -> str:
    """Qwen3ForCausalLM name → MOSS checkpoint name (model.X → language_model.X)."""
    if hf_name == "lm_head.weight":
        return "lm_heads.0.weight"
    return "language_model." + hf_name.removeprefix("model.")


def expected_gguf_tensors(hp) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF tensor name → (Qwen3ForCausalLM name, HF shape), output head always present."""
    import gguf


    names = gguf.get_tensor_name_map(ARCH, hp.n_layers)
    out = {}
    for hf, shape in expected_shapes(hp).items():
        new = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if new is not None:
            out[new] = (hf, shape)
    return out
