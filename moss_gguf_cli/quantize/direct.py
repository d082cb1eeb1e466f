"""Quantize straight from the checkpoint: one read of the source for every requested type.

The guide's chain writes an f16 GGUF and has llama-quantize read it back. Here each source
tensor is read once, rounded exactly as that intermediate would hold it, widened to
float32 as llama-quantize widens it, and quantized with ggml's own routines from the
libggml llama-cpp-python ships, for every requested type in the same pass.

What llama-quantize decides is asked of llama.cpp itself, not re-derived:
- each tensor's type, by a dry run of `llama_model_quantize` on a stand-in GGUF that has
  the real header and no data (a sparse file: it takes no disk);
- each output's header, by ggml's GGUF API, which is what llama-quantize writes with,
  called in the order it calls it (key/values copied, version and file type set, the
  tensors in the loader's order with their new types).
The tests compare every byte with llama-quantize's output.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from ..bf16 import bfloat16
from ..disk.digests import HashRecord
from ..disk.page_cache import SourcePages
from ..disk.sinks import appender
from ..disk.staging import staged_file
from ..errors import InputError, NumericError, ToolError, UsageError
from ..gguf.file_types import file_type_table
from ..gguf.first_class import FILE_STEM
from ..gguf.imatrix import OVERRIDE_STR_BYTES, ImatrixData, imatrix_kvs, load_imatrix
from ..gguf.stream import (
    CHUNK_BYTES,
    GGUFTensor,
    Scratch,
    check_bf16_rows,
    convert_rows,
    produce_chunks,
)
from ..gguf.write import GGUFPlan, OutType, plan_backbone_tensors, write_header
from ..hold_points import hold
from ..native import libggml
from ..native import llama_tools as lc
from ..progress import ProgressReporter, ensure
from ..source.backbone import open_backbone, plan_native
from ..source.checkpoint import MossCheckpoint
from ..source.first_class import plan_first_class
from .engines import (
    Choice,
    Companion,
    Engine,
    Quantized,
    QuantizeRequest,
    QuantizeResult,
    direct_unavailable,
)
from .llama import (
    QuantizeJob,
    QuantizeSettings,
    library_quantize,
    quantize_command,
)

log = logging.getLogger(__name__)

ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT: llama-quantize writes with it whatever the input says
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")  # llama-quantize drops them
_QT = gguf.GGMLQuantizationType


class DirectUnavailable(Exception):
    """The direct path cannot run here (no llama-cpp-python, no sparse files); use another."""


@dataclass
class DirectTarget:
    """One output GGUF: its type per tensor (llama.cpp's choice) and its header bytes."""

    output: Path
    file_type: str
    types: dict[str, int]  # tensor name -> ggml type id
    header: libggml.HeaderBytes
    rows: list[lc.TensorRow] = field(default_factory=list)
    fallbacks: list[lc.TensorFallback] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    positional: bool = False  # tensors not in read order (the kept intermediate): pwrite
    plan: GGUFPlan | None = None  # the GGUF it is quantized from (its own tensors)
    kept: bool = False  # the f16/bf16 GGUF itself, not a quantize result

    def holds(self, name: str) -> bool:
        """In a joint pass a target writes only its own tensors."""
        return name in self.types

    @property
    def size(self) -> int:
        return len(self.header.meta) + self.header.data_bytes


@dataclass
class DirectPlan:
    source: GGUFPlan
    tensors: list[GGUFTensor]  # in read order: the quantized outputs' order
    targets: list[DirectTarget]
    imatrix: ImatrixData | None
    threads: int

    @property
    def output_bytes(self) -> int:
        return sum(t.size for t in self.targets)


# --------------------------------------------------------------------------- planning


def plan_direct(
    source: GGUFPlan,
    outputs: list[tuple[Path, str]],
    settings: QuantizeSettings,
    imatrix: ImatrixData | None,
    scratch_dir: Path,
    intermediate: Path | None = None,
) -> DirectPlan:
    """Ask llama.cpp what each output holds; no tensor data is read.

    ``intermediate``: also write the f16/bf16 GGUF the guide's chain would have made.
    """
    why = direct_unavailable()
    if why:
        raise DirectUnavailable(why)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    stand_in = scratch_dir / f".stand-in-{os.getpid()}.gguf"
    # an architecture the stock llama.cpp does not know: its dry run reads a qwen3 stand-in
    # with the same tensors, and the outputs copy the file's own header
    dry = source.dry_run_plan()
    own = stand_in if dry is source else scratch_dir / f".header-{os.getpid()}.gguf"
    try:
        header_len = _sparse_header(stand_in, dry, scratch_dir)
        targets = [
            _dry_run(stand_in, out, file_type, settings, imatrix, source)
            for out, file_type in outputs
        ]
        for t in targets:  # the user's types over llama.cpp's (as llama-quantize --tensor-type)
            t.types.update({n: int(q) for n in t.types if (q := source.forced_type(n)) is not None})
            t.plan = source
        order = [r.name for r in targets[0].rows]
        for t in targets[1:]:
            if [r.name for r in t.rows] != order:
                raise AssertionError("llama.cpp gave two types different tensor orders")
        if own is not stand_in:
            header_len = _sparse_header(own, source, scratch_dir)
        with libggml.GgufHeader(own) as src:
            for t in targets:
                t.header = _header(src, t, settings, imatrix)
            if intermediate is not None:
                targets.append(_intermediate(src, own, header_len, intermediate, source))
    finally:
        stand_in.unlink(missing_ok=True)
        own.unlink(missing_ok=True)
    by_name = {t.name: t for t in source.tensors}
    if sorted(order) != sorted(by_name):
        raise AssertionError("llama.cpp's tensor list differs from the plan's")
    threads = settings.threads or os.cpu_count() or 1
    return DirectPlan(source, [by_name[n] for n in order], targets, imatrix, threads)


def _sparse_header(path: Path, plan: GGUFPlan, scratch_dir: Path) -> int:
    """The plan's GGUF at path with its data a hole (no disk; llama.cpp only maps it); the
    header's length."""
    header_len, _, size = write_header(path, plan)
    os.truncate(path, size)
    if os.stat(path).st_blocks * 512 > header_len + (16 << 20):
        raise DirectUnavailable(f"the file system of {scratch_dir} has no sparse files")
    return header_len


def _dry_run(
    stand_in: Path,
    output: Path,
    file_type: str,
    s: QuantizeSettings,
    imatrix: ImatrixData | None,
    source: GGUFPlan,
) -> DirectTarget:
    """llama_model_quantize's dry run: which type each tensor gets, in which order."""
    file_type_id = file_type_table()[file_type]
    command = quantize_command(lc.QUANTIZE_BIN, stand_in, output, file_type, s)
    job = QuantizeJob(stand_in, output, file_type, file_type_id, Engine.LIBRARY, command, s)
    parser = lc.QuantizeLogParser()
    rc = library_quantize(job, output, s, imatrix, parser.feed, dry_run=True)
    parser.close()
    if rc != 0 or parser.error:
        why = parser.error or lc.last_lines(list(parser.lines))
        raise ToolError(f"llama.cpp cannot plan {file_type}: {why}")
    if imatrix is None and any("will require an imatrix" in line for line in parser.lines):
        raise UsageError(
            f"{file_type} needs an importance matrix",
            hint="pass --imatrix FILE (made by llama-imatrix), or choose another type",
        )
    if len(parser.rows) != len(source.tensors):
        raise ToolError(
            f"llama.cpp's dry run listed {len(parser.rows)} tensors, expected "
            f"{len(source.tensors)}: {lc.last_lines(list(parser.lines))}"
        )
    types = {r.name: int(_QT[r.dst_type.upper()]) for r in parser.rows}
    empty = libggml.HeaderBytes(b"", {}, {}, 0)
    return DirectTarget(output, file_type, types, empty, parser.rows, parser.fallbacks, command)


def _header(
    src: libggml.GgufHeader,
    t: DirectTarget,
    s: QuantizeSettings,
    imatrix: ImatrixData | None,
) -> libggml.HeaderBytes:
    """The header llama-quantize would write for this target."""
    overrides: list[tuple[str, int | bytes]] = []
    if imatrix is not None:
        for key, value in imatrix_kvs(imatrix, str(s.imatrix)):
            overrides.append(
                (key, value.encode()[:OVERRIDE_STR_BYTES] if isinstance(value, str) else value)
            )
    return libggml.build_header(
        src,
        [(r.name, t.types[r.name]) for r in t.rows],
        [
            ("general.quantization_version", gguf.GGML_QUANT_VERSION),
            ("general.file_type", file_type_table()[t.file_type]),
        ],
        list(_SPLIT_KEYS),
        overrides,
    )


def _intermediate(
    src: libggml.GgufHeader, stand_in: Path, header_len: int, output: Path, source: GGUFPlan
) -> DirectTarget:
    """The f16/bf16 GGUF itself: the stand-in's header, the plan's types and order."""
    with open(stand_in, "rb") as fh:
        head = fh.read(header_len)
    meta = head + b"\0" * (-header_len % ALIGNMENT)
    offsets, sizes, at = {}, {}, 0
    for t in source.tensors:
        offsets[t.name], sizes[t.name] = at, t.nbytes
        at += t.nbytes + (-t.nbytes % ALIGNMENT)
    header = libggml.HeaderBytes(meta, offsets, sizes, at)
    types = {t.name: int(t.qtype) for t in source.tensors}
    return DirectTarget(
        output, source.outtype.value.upper(), types, header, positional=True, plan=source, kept=True
    )


def join_plans(plans: list[DirectPlan]) -> DirectPlan:
    """One pass for several families of outputs (the backbone's GGUFs and the first-class
    ones): the widest plan's read order; every tensor the others hold is the same source
    read and rounded the same way (checked), so it is read once, and quantized once per
    distinct type. A family whose order is not the read order's is written by position."""
    wide = max(plans, key=lambda p: len(p.tensors))
    by_name = {t.name: t for t in wide.tensors}
    targets: list[DirectTarget] = []
    for p in plans:
        if p.imatrix is not wide.imatrix or p.threads != wide.threads:
            raise AssertionError("a joint pass needs one importance matrix and thread count")
        if any(by_name.get(t.name) != t for t in p.tensors):
            raise AssertionError("the plans name different source tensors alike")
        own = {t.name for t in p.tensors}
        in_order = [n for n in by_name if n in own] == [t.name for t in p.tensors]
        for target in p.targets:
            target.positional = target.positional or not in_order
        targets += p.targets
    return DirectPlan(wide.source, wide.tensors, targets, wide.imatrix, wide.threads)


# --------------------------------------------------------------------------- running


class _Quantizer:
    """Widens, quantizes and checks a chunk's rows on a pool of threads, one row slice per
    thread and every output type per slice (ctypes and numpy's casts free the GIL), as
    llama-quantize's workers each quantize and validate their own rows."""

    def __init__(self, threads: int):
        self.threads = threads
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="quantize")

    def submit(self, plan: DirectPlan, t: GGUFTensor, data: np.ndarray, imatrix, slot: Scratch):
        """Start quantizing data (rows of t, in the intermediate's type) for every target that
        changes its type; returns (futures, {target index: quantized bytes})."""
        rows, cols = data.shape
        types = {i: target.types[t.name] for i, target in enumerate(plan.targets)
                 if target.holds(t.name)}  # fmt: skip
        # one quantization per distinct type: Q4_K_M's Q6_K tensors are byte for byte the
        # Q6_K file's (same rows, same imatrix, same routine), so a run making both shares them
        distinct = sorted({type_id for type_id in types.values() if type_id != int(t.qtype)})
        if not distinct:
            return [], {}
        sizes = [rows * libggml.row_size(type_id, cols) for type_id in distinct]
        buf = slot.take(np.uint8, (sum(sizes),))
        by_type, at = {}, 0
        for type_id, n in zip(distinct, sizes, strict=True):
            by_type[type_id] = buf[at:at + n]
            at += n
        outs = {i: by_type[type_id] for i, type_id in types.items() if type_id in by_type}
        wide = data if t.qtype == _QT.F32 else slot.take(np.float32, (rows, cols))
        work = list(by_type.items())
        k = max(1, min(self.threads, rows))
        cuts = [rows * j // k for j in range(k + 1)]
        futures = [
            self.pool.submit(_quantize_slice, t.qtype, data, wide, work, a, b, imatrix)
            for a, b in zip(cuts, cuts[1:], strict=False)
            if b > a
        ]
        return futures, outs

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _quantize_slice(qtype, data: np.ndarray, wide: np.ndarray, work, a: int, b: int, imatrix):
    """Rows a..b: float32 as llama-quantize dequantizes them (exact), then every type."""
    if wide is not data:
        _widen_into(data[a:b], wide[a:b], qtype)
    cols = data.shape[1]
    for type_id, out in work:
        size = libggml.row_size(type_id, cols)
        if libggml.quantize_rows(type_id, wide, out, a, b, imatrix) != (b - a) * size:
            raise AssertionError("ggml quantized a different number of bytes")
        if not libggml.valid_rows(type_id, out[a * size:b * size]):
            raise ToolError(f"ggml's check of the quantized {_QT(type_id).name} data failed")


def _read_rows(t: GGUFTensor, raw: np.ndarray, scratch: Scratch) -> np.ndarray:
    """The reader's part: bf16 rows bound for an f16 intermediate stay bf16 bit patterns
    (checked as convert checks them); the workers round them as they widen."""
    if t.source.dtype == "BF16" and t.qtype == _QT.F16:
        check_bf16_rows(t, raw)
        return raw
    return convert_rows(t, raw, scratch)


_F16_NORMAL_BF16 = 0x3880  # the bf16 magnitude bits of 2**-14, float16's smallest normal


def _widen_into(src: np.ndarray, dst: np.ndarray, qtype: _QT) -> None:
    """float32 of the intermediate's values, as llama-quantize dequantizes them (exact).

    bf16 bits bound for f16: every bf16 value in float16's normal range is exact in it, so
    only the magnitudes below 2**-14 (well under 1% of weights) go through the f16
    rounding; the rest is a shift. Same values as bf16 → f16 → f32, at a third the cost."""
    if src.dtype == np.uint16:
        np.left_shift(src, 16, out=dst.view(np.uint32), dtype=np.uint32)
        if qtype == _QT.F16:
            small = np.flatnonzero((src & 0x7FFF) < _F16_NORMAL_BF16)
            if small.size:
                tiny = src.reshape(-1)[small].view(bfloat16()).astype(np.float16)
                dst.reshape(-1)[small] = tiny.astype(np.float32)
    else:
        np.copyto(dst, src, casting="unsafe")


def _as_intermediate(data: np.ndarray, t: GGUFTensor) -> np.ndarray:
    """The bytes the f16/bf16 intermediate holds for these rows (for a type that stays)."""
    if t.qtype == _QT.F16 and data.dtype == np.uint16:
        out = np.empty(data.shape, np.float16)
        np.copyto(out, data.view(bfloat16()), casting="unsafe")
        return out
    return np.ascontiguousarray(data)


def _imatrix_for(plan: DirectPlan, t: GGUFTensor) -> np.ndarray | None:
    """This tensor's importance vector, checked as llama-quantize checks it."""
    if plan.imatrix is None:
        return None
    values = plan.imatrix.entries.get(t.name)
    if values is None:
        log.info("the importance matrix has no entry for %s", t.name)
        return None
    cols = t.shape[-1]
    if values.size != cols:
        if t.name.startswith("token_embd."):
            return None  # llama-quantize, too, quantizes the embedding without it
        raise InputError(
            f"importance matrix entry {t.name} has {values.size} values for {cols} columns",
            hint="use an imatrix made for this model",
        )
    return np.ascontiguousarray(values, dtype=np.float32)


class _Outputs:
    """The open output files, each fed tensor after tensor (enter on an ExitStack)."""

    def __init__(self, plan: DirectPlan, paths: list[Path], stack: ExitStack):
        self.plan = plan
        self.files = [stack.enter_context(open(p, "w+b")) for p in paths]
        self.sinks: list = []
        # each appended output is hashed as it is written: layout's manifest reuses the digest
        self.digests: list = []
        for target, fh, path in zip(plan.targets, self.files, paths, strict=True):
            fh.write(target.header.meta)
            if target.positional:
                fh.truncate(target.size)
                self.sinks.append(None)
                self.digests.append(None)
            else:
                sink = stack.enter_context(appender(fh, path, len(target.header.meta), target.size))
                self.sinks.append(sink)
                self.digests.append(hashlib.sha256(target.header.meta))

    def write(self, i: int, name: str, done: int, data: np.ndarray) -> None:
        target = self.plan.targets[i]
        if target.positional:
            at = len(target.header.meta) + target.header.offsets[name] + done
            os.pwrite(self.files[i].fileno(), memoryview(data).cast("B"), at)
        else:
            self.sinks[i].write(data)
            self.digests[i].update(memoryview(data).cast("B"))

    def pad(self, i: int, name: str) -> None:
        if self.sinks[i] is not None and self.plan.targets[i].holds(name):
            n = self.plan.targets[i].header.sizes[name]
            zeros = b"\0" * (-n % ALIGNMENT)
            self.sinks[i].write(zeros)
            self.digests[i].update(zeros)

    def check(self) -> None:
        for target, sink in zip(self.plan.targets, self.sinks, strict=True):
            if sink is not None and sink.tell() != target.size:
                raise AssertionError(
                    f"{target.output.name}: wrote {sink.tell()} bytes, planned {target.size}"
                )


def run_direct(
    plan: DirectPlan,
    force: bool = False,
    progress: ProgressReporter | None = None,
    pages: SourcePages | None = None,
    record: HashRecord | None = None,
) -> list[QuantizeResult]:
    """Read each source tensor once and write every target; one result per quantized type.
    RECORD gets each output's digest and that every block passed ggml's validator."""
    bar = ensure(progress)
    started = time.perf_counter()
    names = ", ".join(dict.fromkeys(t.file_type for t in plan.targets))
    bar.start("quantize:bytes", f"quantize {names}", plan.source.source_bytes, "B")
    bar.start("quantize:tensors", "tensors", len(plan.tensors), "")
    try:
        with ExitStack() as staged:
            # outer: each temporary name becomes its output only if the pass completes
            paths = [staged.enter_context(staged_file(t.output, force=force)) for t in plan.targets]
            with ExitStack() as files:
                outputs = _Outputs(plan, paths, files)
                _stream(plan, outputs, bar, pages)
        for target, digest in zip(plan.targets, outputs.digests, strict=True):
            if digest is not None and record is not None:  # every block passed the validator
                record.remember_checked_gguf(target.output, digest.hexdigest())
    finally:
        bar.finish("quantize:tensors")
        bar.finish("quantize:bytes")
    return _results(plan, time.perf_counter() - started)


# chunks in flight beyond the one being written: the pool quantizes the next chunk while
# this thread writes the last, so neither waits on the other
_IN_FLIGHT = 1


@dataclass
class _Pending:
    """A submitted chunk (or, with futures None, a tensor's end) waiting to be written."""

    t: GGUFTensor
    row0: int = 0
    data: np.ndarray | None = None
    scratch: Scratch | None = None
    src_bytes: int = 0
    futures: list | None = None
    outs: dict = field(default_factory=dict)
    slot: Scratch | None = None


def _stream(plan: DirectPlan, outputs: _Outputs, bar: ProgressReporter, pages) -> None:
    """The pass itself: a reader thread reads and rounds, the pool quantizes, this thread
    writes what the pool finished while the pool works on the next chunk."""
    ready: queue.Queue = queue.Queue()
    free: queue.Queue = queue.Queue()
    for _ in range(_IN_FLIGHT + 3):  # in flight, being written, being read, ready
        free.put(Scratch(CHUNK_BYTES))
    slots = [Scratch(0) for _ in range(_IN_FLIGHT + 1)]
    stop = threading.Event()
    reader = threading.Thread(
        target=produce_chunks, args=(plan.tensors, ready, free, stop, pages, _read_rows),
        name="direct-read", daemon=True,
    )  # fmt: skip
    quantizer = _Quantizer(plan.threads)
    pending: list[_Pending] = []

    def flush(keep: int) -> None:
        """Write what is pending, in order, until only `keep` chunks are left in flight."""
        while sum(p.futures is not None for p in pending) > keep or (
            pending and pending[0].futures is None
        ):
            p = pending.pop(0)
            if p.futures is None:
                for i in range(len(plan.targets)):
                    outputs.pad(i, p.t.name)
                continue
            for f in p.futures:
                f.result()
            _write_chunk(plan, outputs, p)
            free.put(p.scratch)
            slots.append(p.slot)
            bar.advance("quantize:bytes", p.src_bytes)

    reader.start()
    try:
        t: GGUFTensor | None = None
        done, imatrix = 0, None
        while True:
            msg = ready.get()
            if msg[0] == "data":
                _, data, scratch, src_bytes = msg
                slot = slots.pop()
                futures, outs = quantizer.submit(plan, t, data, imatrix, slot)
                pending.append(_Pending(t, done, data, scratch, src_bytes, futures, outs, slot))
                done += data.shape[0]
                flush(_IN_FLIGHT)
            elif msg[0] == "start":
                t, done = msg[1], 0
                imatrix = _imatrix_for(plan, t)
                bar.advance("quantize:tensors", 0, description=t.name)
            elif msg[0] == "end":
                pending.append(_Pending(t))  # its padding follows its last chunk
                flush(_IN_FLIGHT)
                bar.advance("quantize:tensors", 1, description=t.name)
                hold("quantize")
            elif msg[0] == "error":
                raise msg[1]
            else:
                break
        flush(0)
        outputs.check()
    finally:
        stop.set()
        free.put(Scratch(0))
        reader.join()
        quantizer.close()


def _write_chunk(plan: DirectPlan, outputs: _Outputs, p: _Pending) -> None:
    """Rows p.row0.. of tensor p.t into every output: quantized, or copied as llama-quantize
    copies a tensor whose type stays."""
    for i, target in enumerate(plan.targets):
        if not target.holds(p.t.name):
            continue
        if i in p.outs:
            at = p.row0 * libggml.row_size(plan.targets[i].types[p.t.name], p.data.shape[1])
            outputs.write(i, p.t.name, at, p.outs[i])
        else:
            rows = _as_intermediate(p.data, p.t)
            outputs.write(i, p.t.name, p.row0 * rows.strides[0], rows)


def _results(plan: DirectPlan, seconds: float) -> list[QuantizeResult]:
    v = lc.library_version()
    version = v.describe() if v else "llama-cpp-python"
    results = []
    for target in plan.targets:
        if target.kept:
            continue  # the kept intermediate is not a quantize result
        source = target.plan or plan.source
        n_el = max(sum(int(np.prod(t.shape)) for t in source.tensors), 1)
        size = target.output.stat().st_size
        data = sum(target.header.sizes.values())  # llama.cpp counts tensors without padding
        results.append(
            QuantizeResult(
                input=source.tensors[0].source.path.parent,
                output=target.output,
                file_type=target.file_type,
                engine=Engine.DIRECT.value,
                command=target.command,
                input_bytes=source.source_bytes,
                output_bytes=size,
                n_elements=n_el,
                input_bpw=source.tensor_bytes * 8 / n_el,
                bpw=data * 8 / n_el,
                seconds=seconds,
                tensors=target.rows,
                fallbacks=target.fallbacks,
                llama_cpp=version,
            )
        )
    return results


# --------------------------------------------------------------------------- from a checkpoint


@dataclass
class CheckpointQuantized:
    results: list[QuantizeResult]
    outtype: str  # the intermediate's type the values were rounded through: f16 or bf16
    intermediate: Path | None  # the f16/bf16 GGUF, when asked for
    notes: list[str] = field(default_factory=list)


def quantize_checkpoint(
    model: Path | MossCheckpoint,
    outputs: list[tuple[Path, str]],
    outtype: str,
    settings: QuantizeSettings,
    imatrix: ImatrixData | None,
    scratch_dir: Path,
    keep_intermediate: bool = False,
    force: bool = False,
    progress: ProgressReporter | None = None,
    pages: SourcePages | None = None,
    record: HashRecord | None = None,
    first_class: bool = False,
    audio_tables: str | None = None,
    also: Companion | None = None,
) -> CheckpointQuantized:
    """The checkpoint's backbone, quantized to every (output, type) in one read.

    ``outtype`` auto rounds through f16 unless a tensor overflows it, then through bf16,
    as `all`'s two-pass path chooses its intermediate. ``first_class``: the whole model as
    one moss-tts-delay GGUF (gguf/first_class.py) instead of the backbone alone, its audio tables
    in ``audio_tables`` (f16, bf16, q8_0) if given. ``also``: the first-class GGUFs too, from
    the same read (join_plans); their results follow the backbone's.
    """
    plan_source = _source_planner(model, first_class, audio_tables)
    stem = FILE_STEM if first_class else "backbone"
    notes: list[str] = []
    for kind in ("f16", "bf16") if outtype == "auto" else (outtype,):
        source = plan_source(OutType.parse(kind))
        kept = scratch_dir / f"{stem}_{kind}.gguf" if keep_intermediate else None
        plan = plan_direct(source, outputs, settings, imatrix, scratch_dir, kept)
        if also is not None:
            plan = join_plans([plan, _companion_plan(model, also, kind, settings, scratch_dir)])
        try:
            results = run_direct(plan, force=force, progress=progress, pages=pages, record=record)
        except NumericError as exc:
            if outtype != "auto" or kind == "bf16":
                raise
            notes.append(f"f16 would overflow ({exc.message}); rounded through bf16 instead")
            log.warning(notes[-1])
            pages = None  # the ranges were read once already: nothing left to drop
            continue
        return CheckpointQuantized(results, kind, kept, notes)
    raise AssertionError("unreachable")


def _companion_plan(
    model, also: Companion, kind: str, settings: QuantizeSettings, scratch_dir: Path
) -> DirectPlan:
    """The first-class family's plan, rounded through the same intermediate type."""
    root = model.root if isinstance(model, MossCheckpoint) else Path(model)
    source = _source_planner(root, True, also.audio_tables)(OutType.parse(kind))
    kept = also.keep / f"{FILE_STEM}_{kind}.gguf" if also.keep is not None else None
    return plan_direct(source, also.outputs, settings, None, scratch_dir, kept)


@dataclass
class DirectQuantizer:
    """The direct engine as `all` runs it: every output from the checkpoint in one read."""

    choice: Choice

    def quantize(
        self, request: QuantizeRequest, force: bool, progress: ProgressReporter
    ) -> Quantized:
        imatrix = load_imatrix(request.imatrix) if request.imatrix is not None else None
        settings = QuantizeSettings(threads=request.threads, imatrix=request.imatrix)
        q = quantize_checkpoint(
            request.checkpoint, request.outputs, request.outtype, settings, imatrix, request.work,
            keep_intermediate=request.keep_intermediate, force=force, progress=progress,
            pages=request.pages, record=request.record, also=request.also,
        )  # fmt: skip
        return Quantized(q.results, q.intermediate, q.notes)


def _source_planner(model, first_class: bool, audio_tables: str | None = None):
    """out type -> the plan of the GGUF the outputs are quantized from."""
    if first_class:
        return lambda out_type: plan_first_class(model, out_type, audio_tables)
    backbone = open_backbone(model)

    def plan(out_type):
        tensors = plan_backbone_tensors(backbone.params, backbone.tensors, out_type, backbone.root)
        return plan_native(backbone, out_type, tensors)

    return plan
