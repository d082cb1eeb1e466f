"""One read of every file: hashes for the manifest, Inf/NaN tests, equality with the source.

Every file is read once, in chunks, by one worker thread per core, up to 8 (hashlib, file
reads and the NumPy bit tests release the GIL): one pass hashes a file for the manifest,
tests a table's values and, with --source, compares it with its source tensor (a file the
run hashed already, as `all` does while writing, keeps that digest: the run's
disk.digests.HashRecord, handed in as verify's ``record``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bf16 import bfloat16
from ..disk.digests import HashRecord, sha256_file
from ..gguf.read import GgufFile
from ..source.checkpoint import TensorRef
from ..source.tables import npy_jobs
from .context import CHUNK_BYTES, WORKERS, Context
from .structure import expected_tables, manifest_entries, manifest_row, table_rows
from .target import shown_path
from .tensors import SOURCE_DTYPES, pread

F16_MAX = 65504.0


@dataclass
class FileJob:
    rel: str
    path: Path
    table: bool = False
    shape: tuple[int, int] | None = None  # expected, for a table
    source: TensorRef | None = None  # for a table, with --source
    sha256: str | None = None  # expected, from the manifest
    gguf: GgufFile | None = None  # a GGUF whose tensor values are scanned


@dataclass
class FileResult:
    job: FileJob
    size: int = 0
    sha256: str | None = None
    error: str | None = None  # unreadable file
    header_error: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    fortran: bool = False
    data_offset: int = 0
    expected_size: int | None = None
    nonfinite: int = 0
    first_nonfinite_row: int | None = None
    beyond_f16: int = 0  # float32 values a float16 table could not hold
    source_problem: str | None = None
    gguf_nonfinite: list[str] = field(default_factory=list)  # tensors holding Inf/NaN
    gguf_unscanned: set[str] = field(default_factory=set)  # types without a known layout


def _read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    return tuple(shape), bool(fortran), np.dtype(dtype), f.tell()


def _nonfinite_f16(bits: np.ndarray, scratch: np.ndarray) -> np.ndarray | None:
    """Positions whose exponent bits are all ones (Inf/NaN in float16), or None."""
    np.bitwise_and(bits, 0x7C00, out=scratch)
    if int(scratch.max(initial=0)) != 0x7C00:
        return None
    return np.flatnonzero(scratch == 0x7C00)


def stream_file(
    job: FileJob, on_bytes: Callable[[int], None], record: HashRecord | None = None
) -> FileResult:
    """One read of a file: sha256 (if the manifest lists it); for a table its header,
    length, values and (with --source) equality with its source tensor. What RECORD (the
    run's) says a writer checked or hashed is taken instead of read again."""
    res = FileResult(job)
    record = record if record is not None else HashRecord()
    try:
        res.size = job.path.stat().st_size
        if job.table and job.source is None and (written := record.known_table(job.path)):
            # written by this process, which checked every value as it wrote it
            facts, digest = written
            res.shape, res.dtype, res.data_offset = facts.shape, facts.dtype, facts.data_offset
            data = math.prod(facts.shape) * np.dtype(facts.dtype).itemsize
            res.expected_size = facts.data_offset + data
            res.sha256 = digest if job.sha256 is not None else None
            on_bytes(res.size)
            return res
        if job.gguf is not None and (checked := record.known_checked_gguf(job.path)):
            # quantized by this process, which validated every block as it wrote it
            res.sha256 = checked if job.sha256 is not None else None
            on_bytes(res.size)
            return res
        known = record.known_sha256(job.path) if job.sha256 is not None else None
        if known is not None:  # hashed by this process as it wrote or listed the file
            res.sha256, job = known, dataclasses.replace(job, sha256=None)
        if job.gguf is not None:
            _stream_gguf(job, res, on_bytes)
            return res
        if not job.table:
            if job.sha256 is not None:
                res.sha256 = sha256_file(job.path)
            on_bytes(res.size)
            return res
        with open(job.path, "rb", buffering=0) as f:
            digest = hashlib.sha256() if job.sha256 is not None else None
            try:
                shape, fortran, dtype, offset = _read_npy_header(f)
            except (ValueError, OSError, SyntaxError, EOFError) as exc:
                res.header_error = " ".join(str(exc).split())[:120]
                if digest is not None:
                    f.seek(0)
                    while chunk := f.read(CHUNK_BYTES):
                        digest.update(chunk)
                    res.sha256 = digest.hexdigest()
                on_bytes(res.size)
                return res
            res.shape, res.fortran, res.dtype, res.data_offset = shape, fortran, dtype.str, offset
            res.expected_size = offset + math.prod(shape) * dtype.itemsize
            if digest is not None:
                f.seek(0)
                digest.update(f.read(offset))
            _stream_table(f, res, dtype, digest, on_bytes)
            on_bytes(offset)
            if digest is not None:
                res.sha256 = digest.hexdigest()
    except OSError as exc:
        res.error = exc.strerror or str(exc)
    return res


def _stream_table(f, res: FileResult, dtype: np.dtype, digest, on_bytes) -> None:
    job = res.job
    item = dtype.itemsize
    row_len = res.shape[-1] if res.shape and len(res.shape) >= 1 and res.shape[-1] else 1
    n_expected = math.prod(res.shape) if res.shape else 0
    is_float = dtype.kind == "f" and item in (2, 4)
    chunk_elems = max(row_len, (CHUNK_BYTES // item) // row_len * row_len)
    buf = bytearray(chunk_elems * item)
    view = memoryview(buf)
    scratch = np.empty(chunk_elems, dtype=np.uint16) if item == 2 else None
    src = job.source
    src_ok = src is not None and is_float and tuple(src.shape) == tuple(res.shape)
    if src is not None and not src_ok:
        res.source_problem = (
            f"shape {list(res.shape)} {dtype.name} vs source {src.name} {list(src.shape)}"
        )
    src_fd = os.open(src.path, os.O_RDONLY) if src_ok else -1
    try:
        done = 0  # elements read
        while True:
            n = f.readinto(view)
            if not n:
                break
            if digest is not None:
                digest.update(view[:n])
            on_bytes(n)
            whole = min(n // item, max(0, n_expected - done))
            if whole and is_float:
                values = np.frombuffer(buf, dtype=dtype, count=whole)
                _check_values(values, res, done, row_len, scratch)
                if src_ok and res.source_problem is None:
                    _compare_with_source(values, res, src, src_fd, done, row_len, dtype)
            done += n // item
    finally:
        if src_fd >= 0:
            os.close(src_fd)


# Byte offsets of the float16 scales inside one block of each quantized type (ggml's block
# structs): an Inf/NaN scale is the only way a quantized block dequantizes to Inf/NaN, so
# testing the scales finds them without dequantizing. tests/test_verify.py checks every
# entry against gguf's own dequantizer.
SCALE_OFFSETS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "IQ3_S": (0,),
    "IQ3_XXS": (0,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ1_S": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
}


_FLOAT_EXP = {
    "F32": (np.uint32, 0x7F800000),
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
}


def finite_blocks(buf: bytes, type_name: str) -> bool | None:
    """Whether whole blocks of a tensor type hold only finite values (None: layout unknown)."""
    if type_name in _FLOAT_EXP:
        dtype, exp = _FLOAT_EXP[type_name]
        bits = np.frombuffer(buf, dtype=np.dtype(dtype).newbyteorder("<"))
        return not bool(np.any(np.bitwise_and(bits, exp) == exp))
    offsets = SCALE_OFFSETS.get(type_name)
    if offsets is None:
        return None
    import gguf

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    blocks = np.frombuffer(buf, dtype=np.uint8).reshape(-1, block)
    for off in offsets:
        scale = np.ascontiguousarray(blocks[:, off : off + 2]).view("<u2")
        if np.any(np.bitwise_and(scale, 0x7C00) == 0x7C00):
            return False
    return True


def _stream_gguf(job: FileJob, res: FileResult, on_bytes: Callable[[int], None]) -> None:
    """Read a GGUF once, in file order: hash it (if the manifest lists it) and test every
    tensor's values (floats) or block scales (quantized types) for Inf/NaN."""
    import gguf

    g = job.gguf
    digest = hashlib.sha256() if job.sha256 is not None else None
    with open(job.path, "rb", buffering=0) as f:
        pos = 0

        def read(n: int) -> bytes:
            nonlocal pos
            chunk = f.read(n)
            pos += len(chunk)
            if digest is not None:
                digest.update(chunk)
            on_bytes(len(chunk))
            return chunk

        def skip_to(end: int) -> bool:
            while pos < end:
                if not read(min(CHUNK_BYTES, end - pos)):
                    return False
            return True

        for t in sorted(g.tensors.values(), key=lambda t: t.offset):
            start = g.abs_offset(t)
            if start < pos or (g.endian != "<" and t.type_name in _FLOAT_EXP):
                res.gguf_unscanned.add(t.type_name)
                continue
            if not skip_to(start):
                break
            block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.type_name]][1]
            step = max(block, CHUNK_BYTES // block * block)
            left = t.nbytes
            while left > 0:
                chunk = read(min(step, left))
                if not chunk:
                    break
                left -= len(chunk)
                whole = len(chunk) // block * block
                ok = finite_blocks(chunk[:whole], t.type_name) if whole else True
                if ok is None:
                    res.gguf_unscanned.add(t.type_name)
                elif not ok and t.name not in res.gguf_nonfinite:
                    res.gguf_nonfinite.append(t.name)
        skip_to(res.size)
    if digest is not None:
        res.sha256 = digest.hexdigest()


def _check_values(values, res: FileResult, done: int, row_len: int, scratch) -> None:
    if values.dtype.itemsize == 2:
        bad = _nonfinite_f16(values.view(np.uint16), scratch[: values.size])
        bad_count = 0 if bad is None else bad.size
        first = None if bad is None else int(bad[0])
    else:
        finite = np.isfinite(values)
        bad_count = int(values.size - np.count_nonzero(finite))
        first = int(np.argmin(finite)) if bad_count else None
        with np.errstate(invalid="ignore"):
            res.beyond_f16 += int(np.count_nonzero(np.abs(values) > F16_MAX))
    if bad_count:
        res.nonfinite += bad_count
        if res.first_nonfinite_row is None:
            res.first_nonfinite_row = (done + first) // row_len


def _compare_with_source(values, res, src: TensorRef, fd: int, done: int, row_len: int, dtype):
    sdt = SOURCE_DTYPES.get(src.dtype)
    if sdt is None:
        res.source_problem = f"source {src.name} has dtype {src.dtype}"
        return
    raw = pread(fd, values.size * sdt.itemsize, src.offset + done * sdt.itemsize)
    if len(raw) != values.size * sdt.itemsize:
        res.source_problem = f"source {src.name} ends early"
        return
    s = np.frombuffer(raw, dtype=sdt)
    if src.delta is not None:  # merged LoRA: the rows extract wrote, from the same update
        first, last = done // row_len, -(-(done + values.size) // row_len)
        rows = np.frombuffer(pread(fd, (last - first) * row_len * sdt.itemsize,
                                   src.offset + first * row_len * sdt.itemsize), dtype=sdt)
        merged = src.delta.merged(rows, src.dtype, first).reshape(-1)
        with np.errstate(over="ignore"):
            cast = merged[done - first * row_len:][: values.size].astype(dtype)
    elif src.dtype == "BF16":
        cast = s.view(bfloat16()).astype(dtype)
    else:
        cast = s.astype(dtype)
    uint = np.dtype(f"<u{dtype.itemsize}")
    if not np.array_equal(cast.view(uint), values.view(uint)):
        first = int(np.flatnonzero(cast.view(uint) != values.view(uint))[0])
        row = (done + first) // row_len
        res.source_problem = f"differs from {src.name} from row {row}"


def file_pass(ctx: Context) -> None:
    t = ctx.t
    jobs: dict[Path, FileJob] = {}
    src_tables: dict[str, TensorRef] = {}
    if ctx.ck is not None:
        src_tables = {Path(j.relpath).name: j.source for j in npy_jobs(ctx.ck)}
    for key, name, shape in expected_tables(ctx) if t.kind != "gguf" else []:
        folder = t.embedding_dir if key == "emb" else t.lm_head_dir
        p = folder / name if folder else None
        if p is not None and p.is_file():
            jobs[p] = FileJob(shown_path(p, t.root), p, True, shape, src_tables.get(name))
    for path, g in ctx.ggufs.items():
        jobs[path] = FileJob(shown_path(path, t.root), path, gguf=g)
    manifest = manifest_entries(ctx)
    for rel, entry in manifest.items():
        p = entry["path"]
        if p is None or not p.is_file() or p.stat().st_size != entry["size"]:
            continue  # reported by the manifest row without reading
        job = jobs.setdefault(p, FileJob(rel, p))
        job.sha256 = entry["sha256"]
    ordered = sorted(jobs.values(), key=lambda j: -j.path.stat().st_size)
    total = sum(j.path.stat().st_size for j in ordered)
    ctx.bar.start("verify:read", "verify: read files", total, "B")
    lock = threading.Lock()

    def on_bytes(n: int) -> None:
        with lock:
            ctx.bar.advance("verify:read", n)

    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="verify") as pool:
        results = list(pool.map(lambda j: stream_file(j, on_bytes, ctx.record), ordered))
    ctx.bar.finish("verify:read")
    by_path = {res.job.path: res for res in results}
    ctx.tables = {res.job.rel: res for res in results if res.job.table}
    ctx.gguf_scans = {res.job.path: res for res in results if res.job.gguf is not None}
    table_rows(ctx)
    manifest_row(ctx, manifest, by_path)
