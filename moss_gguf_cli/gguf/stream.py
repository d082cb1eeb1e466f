"""Tensor data for a GGUF: source rows read, converted and appended in chunks, two threads.

Memory stays bounded: the data is appended in row chunks read with plain file reads (a memory
map would count every touched page against the process), converted, and padded to the
alignment GGUFWriter's offsets assume. One thread reads and converts while another writes;
the caller's sink (disk.sinks.appender) decides how the bytes reach the disk. quantize.direct reads
through the same reader thread (`produce_chunks`).
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import gguf
import numpy as np

from ..bf16 import bfloat16
from ..disk.page_cache import SourcePages
from ..errors import InputError, NumericError
from ..hold_points import hold

CHUNK_BYTES = 16 * 1024 * 1024  # source bytes converted at once; bounds the working memory
QT = gguf.GGMLQuantizationType
# safetensors storage dtypes the writer reads (bf16 as its raw 16-bit patterns)
SOURCE_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


class RowDelta(Protocol):
    """An update added to a source tensor's rows as they are read (a merged LoRA adapter,
    source/lora.TensorDelta): the tensor becomes float32 rows + the update."""

    def merged(self, raw: np.ndarray, dtype: str, start: int,
               out: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """RAW (rows from START, storage dtype DTYPE) plus the update, as float32 rows (in
        OUT when given)."""


@dataclass(frozen=True)
class SourceTensor:
    """Where a tensor's bytes lie: a safetensors file, an absolute offset, a storage dtype."""

    name: str  # its name in the file (language_model.* / lm_heads.0.weight in a MOSS source)
    path: Path
    dtype: str  # safetensors dtype: BF16, F16 or F32
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    delta: RowDelta | None = field(default=None, compare=False)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the output: its GGUF name and type, and the source it is made from."""

    name: str
    qtype: gguf.GGMLQuantizationType
    source: SourceTensor

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.shape) // block * size


def _read_exact(f, view: memoryview, src: SourceTensor) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise InputError(
                f"tensor {src.name!r} ends early",
                path=src.path,
                hint="the file is truncated or corrupt; copy or download it again",
            )
        got += n


def _nonfinite(src: SourceTensor) -> NumericError:
    return NumericError(
        f"tensor {src.name!r} holds NaN or Inf",
        path=src.path,
        hint="the checkpoint is damaged; download it again",
    )


def _f16_overflow(t: GGUFTensor, peak: float) -> NumericError:
    return NumericError(
        f"tensor {t.source.name!r} ({t.name}) has values beyond the float16 range "
        f"(|x| up to {peak:.6g} > 65504)",
        path=t.source.path,
        hint="use --outtype bf16 (or f32)",
    )


class Scratch:
    """Working arrays reused chunk after chunk (fresh ones would cost page faults each time)."""

    def __init__(self, nbytes: int):
        self.raw = bytearray(nbytes)
        self._arrays: dict[str, np.ndarray] = {}

    def take(self, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        """An array of dtype and shape over this scratch's own buffer for that dtype."""
        key = np.dtype(dtype).str
        need = math.prod(shape)
        arr = self._arrays.get(key)
        if arr is None or arr.size < need:
            arr = self._arrays[key] = np.empty(max(need, len(self.raw) // 2), dtype=dtype)
        return arr[:need].reshape(shape)


def _bf16_peak_bits(raw: np.ndarray) -> int:
    """The largest |x| among bf16 bit patterns, as magnitude bits (sign cleared).

    Two read-only reductions instead of masking a copy: positive patterns are the
    non-negative int16 values, and the largest uint16 is the negative of largest magnitude.
    """
    if raw.size == 0:
        return 0
    pos = int(raw.view(np.int16).max())
    neg = int(raw.max())
    return max(pos if pos >= 0 else 0, neg - 0x8000 if neg >= 0x8000 else 0)


def check_bf16_rows(t: GGUFTensor, raw: np.ndarray) -> None:
    """Refuse NaN/Inf, and values that overflow t's f16, in rows of bf16 bit patterns."""
    top = _bf16_peak_bits(raw)  # finds NaN/Inf and f16 overflow alike
    if top >= 0x7F80:
        raise _nonfinite(t.source)
    if t.qtype == QT.F16 and top >= 0x4780:  # bf16 65536 and up are inf in f16; 65280 is not
        peak = float(np.left_shift(np.uint32(top), 16).view(np.float32))
        raise _f16_overflow(t, peak)


def convert_rows(t: GGUFTensor, raw: np.ndarray, s: Scratch) -> np.ndarray:
    """Turn rows in storage dtype into the bytes of t.qtype; refuse NaN/Inf and f16 overflow."""
    src, q = t.source, t.qtype
    if src.dtype == "BF16":
        check_bf16_rows(t, raw)
        if q == QT.BF16:
            return raw  # bf16 → f32 → bf16 is the identity for finite values
        if q == QT.F16:
            # ml_dtypes casts bf16 → f16 in one step, exactly as numpy's f32 → f16 rounds
            out = s.take(np.float16, raw.shape)
            np.copyto(out, raw.view(bfloat16()), casting="unsafe")
            return out
        f32 = s.take(np.float32, raw.shape)
        np.left_shift(raw, 16, out=f32.view(np.uint32), dtype=np.uint32)
    else:
        f32 = s.take(np.float32, raw.shape)
        np.copyto(f32, raw, casting="unsafe")
        if not np.isfinite(f32).all():
            raise _nonfinite(src)
        if q == QT.F16:
            out = s.take(np.float16, raw.shape)
            with np.errstate(over="ignore"):
                np.copyto(out, f32, casting="unsafe")
            if not np.isfinite(out).all():
                raise _f16_overflow(t, float(np.abs(f32).max()))
            return out
    if q == QT.F32:
        return f32
    return gguf.quants.quantize(f32, q)


def _chunks(t: GGUFTensor) -> tuple[int, int, int]:
    """(rows, row bytes, rows per chunk) for streaming t's source."""
    src = t.source
    cols = src.shape[-1] if src.shape else 1
    rows = math.prod(src.shape[:-1]) if len(src.shape) > 1 else 1
    row_bytes = cols * SOURCE_DTYPES[src.dtype].itemsize
    return rows, row_bytes, max(1, CHUNK_BYTES // row_bytes)


def _merged_rows(t: GGUFTensor, f32: np.ndarray, s: Scratch, convert) -> np.ndarray:
    """A merged tensor's float32 rows in T's type. To f16 (every intermediate `all` makes
    but bf16's) they are rounded into the chunk's own source buffer, whose bytes are read
    already: a merge keeps the memory of a plain run (no f32 array per chunk in flight)."""
    if t.qtype != QT.F16:
        return convert(t, f32, s)
    if not np.isfinite(f32).all():
        raise _nonfinite(t.source)
    out = np.frombuffer(s.raw, dtype=np.float16, count=f32.size).reshape(f32.shape)
    with np.errstate(over="ignore"):
        np.copyto(out, f32, casting="unsafe")
    if not np.isfinite(out).all():
        raise _f16_overflow(t, float(np.abs(f32).max()))
    return out


def produce_chunks(
    tensors: list[GGUFTensor],
    ready: queue.Queue,
    free: queue.Queue,
    stop: threading.Event,
    pages: SourcePages | None = None,
    convert: Callable[[GGUFTensor, np.ndarray, Scratch], np.ndarray] | None = None,
) -> None:
    """Read and convert chunk after chunk (with `convert`, default the intermediate's
    type); hand each to the writer through `ready`."""
    convert = convert or convert_rows
    work = Scratch(0)  # the reader's own float32 rows of a merged tensor, reused
    try:
        for t in tensors:
            src = t.source
            # a merged tensor is float32 rows once its update is added: converted as such
            as_merged = replace(t, source=replace(src, dtype="F32", delta=None)) \
                if src.delta is not None else t  # fmt: skip
            rows, row_bytes, per_chunk = _chunks(t)
            ready.put(("start", t))
            on_read = pages.reader("convert", src.path, src.offset, src.nbytes) if pages else None
            with open(src.path, "rb", buffering=0) as f:
                f.seek(src.offset)
                for start in range(0, rows, per_chunk):
                    scratch = free.get()
                    if stop.is_set():
                        return
                    n = min(per_chunk, rows - start)
                    if n * row_bytes > len(scratch.raw):  # one row bigger than a chunk
                        scratch = Scratch(n * row_bytes)
                    view = memoryview(scratch.raw)[: n * row_bytes]
                    _read_exact(f, view, src)
                    if on_read is not None:
                        on_read((start + n) * row_bytes)
                    raw = np.frombuffer(view, dtype=SOURCE_DTYPES[src.dtype]).reshape(n, -1)
                    if src.delta is None:
                        data = convert(t, raw, scratch)
                    else:
                        f32 = src.delta.merged(raw, src.dtype, start,
                                               out=work.take(np.float32, raw.shape))  # fmt: skip
                        data = _merged_rows(as_merged, f32, scratch, convert)
                    ready.put(("data", np.ascontiguousarray(data), scratch, n * row_bytes))
            ready.put(("end", t))
        ready.put(("done",))
    except BaseException as exc:  # noqa: BLE001 - handed to the writer thread, raised there
        ready.put(("error", exc))


def write_tensor_data(
    out,
    tensors: list[GGUFTensor],
    alignment: int,
    on_tensor: Callable[[GGUFTensor, bool], None],
    on_bytes: Callable[[int], None],
    pages: SourcePages | None = None,
) -> int:
    """Append every tensor's data to out (positioned after the tensor infos), padded.

    A second thread reads and converts the next chunk while this one writes: reads, writes
    and the NumPy casts all release the GIL, so the two overlap on two cores.
    """
    pad = -out.tell() % alignment
    out.write(b"\0" * pad)
    written = pad
    ready: queue.Queue = queue.Queue()
    free: queue.Queue = queue.Queue()
    for _ in range(2):  # double buffering: bounded memory, one chunk in flight each way
        free.put(Scratch(CHUNK_BYTES))
    stop = threading.Event()
    worker = threading.Thread(
        target=produce_chunks,
        args=(tensors, ready, free, stop, pages),
        name="gguf-convert",
        daemon=True,
    )
    worker.start()
    done = 0
    try:
        while True:
            msg = ready.get()
            if msg[0] == "data":
                _, data, scratch, src_bytes = msg
                out.write(memoryview(data).cast("B"))
                done += data.nbytes
                free.put(scratch)
                on_bytes(src_bytes)
            elif msg[0] == "start":
                on_tensor(msg[1], False)
                done = 0
            elif msg[0] == "end":
                t = msg[1]
                if done != t.nbytes:  # a wrong size would only show as a corrupt file later
                    raise AssertionError(f"{t.name}: wrote {done} bytes, expected {t.nbytes}")
                pad = -t.nbytes % alignment
                out.write(b"\0" * pad)
                written += done + pad
                on_tensor(t, True)
                hold("convert")
            elif msg[0] == "error":
                raise msg[1]
            else:
                return written
    finally:
        stop.set()
        free.put(Scratch(0))  # wake a worker waiting for a buffer; it sees `stop` and ends
        worker.join()
