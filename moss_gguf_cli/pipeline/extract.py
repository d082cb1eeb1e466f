"""`extract`: split a MOSS checkpoint into a Qwen3 backbone, embedding tables and heads.

Streaming and bounded memory: backbone shards are written header first and then the
tensor bytes through the O_DIRECT appenders of disk/sinks.py; `.npy` tables are cast in small
chunks read with plain reads (not memory maps, which would count every touched
page of a multi-GB table against the process). The two streams run side by side:
one is I/O-bound, the other CPU-bound.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..bf16 import bfloat16
from ..disk.digests import HashRecord, TableFacts
from ..disk.layout_names import BACKBONE_DIR, EMBEDDING_DIR, LM_HEAD_DIR, META_NAME
from ..disk.page_cache import SourcePages
from ..disk.sinks import appender
from ..disk.staging import Staging, check_free_space
from ..errors import InputError, NumericError, UsageError
from ..hold_points import hold
from ..progress import ProgressReporter, ensure
from ..source.backbone import backbone_config
from ..source.checkpoint import MossCheckpoint, TensorRef, as_checkpoint
from ..source.safetensors_io import PlannedTensor, to_f32, write_streaming
from ..source.tables import NpyJob, npy_jobs

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD = 5 * 1000**3  # "5GB", as Hugging Face counts it
NPY_DTYPES = ("float16", "float32")
_CHUNK_ELEMS = 1 << 22  # 8 MB of bf16: big writes, small enough to stay in cache


@dataclass
class ExtractResult:
    output: Path
    backbone_dir: Path
    embedding_dir: Path
    lm_head_dir: Path
    backbone_shards: list[Path]
    npy_files: list[Path]
    bytes_written: int
    seconds: float
    n_vq: int
    npy_dtype: str
    notes: list[str] = field(default_factory=list)


def parse_size(text: str | int) -> int:
    """'5GB', '500MB', '2GiB' or a byte count → bytes (Hugging Face's decimal units)."""
    if isinstance(text, int):
        return text
    units = {
        "KIB": 1024,
        "MIB": 1024**2,
        "GIB": 1024**3,
        "TIB": 1024**4,
        "KB": 1000,
        "MB": 1000**2,
        "GB": 1000**3,
        "TB": 1000**4,
        "B": 1,
    }
    s = text.strip().upper()
    unit = next((u for u in units if s.endswith(u)), "")
    number, factor = s[: len(s) - len(unit)].strip(), units.get(unit, 1)
    try:
        value = int(float(number) * factor)
    except ValueError as exc:
        raise UsageError(f"cannot read size {text!r}", hint="write it like 5GB or 500MB") from exc
    if value <= 0:
        raise UsageError(f"size {text!r} must be positive")
    return value


def plan_shards(
    tensors: list[tuple[str, TensorRef]], max_shard_size: int
) -> list[list[tuple[str, TensorRef]]]:
    """Group tensors, in order, into shards of at most max_shard_size.

    A tensor bigger than the limit gets a shard of its own.
    """
    shards: list[list[tuple[str, TensorRef]]] = [[]]
    size = 0
    for name, ref in tensors:
        if shards[-1] and size + ref.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append((name, ref))
        size += ref.nbytes
    return shards


def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf,
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False,
            "shape": tuple(shape),
        },
    )
    return buf.getvalue()


def _cast_rows(raw: np.ndarray, src_dtype: str, out: np.ndarray) -> None:
    """Cast a block of source values into `out` (float16 or float32), exactly."""
    if src_dtype == "BF16":
        np.copyto(out, raw.view(bfloat16()), casting="unsafe")
    else:
        np.copyto(out, raw, casting="unsafe")


# |bf16| bit patterns: from 0x4780 (65536) up a value overflows float16, from 0x7F80 it is Inf/NaN
_BF16_F16_LIMIT = 0x4780
_BF16_NONFINITE = 0x7F80


def _fits(raw: np.ndarray, src_dtype: str, out: np.ndarray, scratch: np.ndarray) -> bool:
    """Whether every value arrived finite in `out`; for bf16 one integer max does it."""
    if src_dtype == "BF16":
        np.bitwise_and(raw, 0x7FFF, out=scratch)
        limit = _BF16_F16_LIMIT if out.dtype == np.float16 else _BF16_NONFINITE
        return int(scratch.max()) < limit
    return bool(np.isfinite(out).all())


class _HashingSink:
    """Hashes what it passes on, in the writer thread (hashlib releases the GIL)."""

    def __init__(self, sink, digest):
        self._sink, self.digest = sink, digest

    def write(self, data) -> None:
        self._sink.write(data)
        self.digest.update(memoryview(data).cast("B"))


def write_npy(
    job: NpyJob,
    dest: Path,
    dtype: str,
    on_bytes,
    stop: threading.Event,
    record: HashRecord | None = None,
    pages: SourcePages | None = None,
) -> int:
    """Stream one table to dest as .npy, refusing values the dtype cannot hold.

    With a ``record`` its sha256 is taken on the way and, with what the writer checked,
    recorded for dest: the run's manifest and verify need not read it.
    """
    ref = job.source
    n = int(np.prod(ref.shape))
    header = npy_header(ref.shape, dtype)
    size = len(header) + n * np.dtype(dtype).itemsize
    digest = hashlib.sha256(header) if record is not None else None
    with open(ref.path, "rb", buffering=0) as src, open(dest, "wb+") as f:
        f.write(header)
        f.flush()
        with (
            appender(f, dest, len(header), size) as sink,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="npy-write") as writer,
        ):
            out = sink if digest is None else _HashingSink(sink, digest)
            on_read = pages.reader("extract", ref.path, ref.offset, ref.nbytes) if pages else None
            _stream_cast(ref, src, n, dtype, out, writer, on_bytes, stop, on_read)
    if digest is not None:
        if np.dtype(dtype) == np.float16:
            # every value passed _fits: finite in float16, the whole of verify's value check
            facts = TableFacts(tuple(ref.shape), np.dtype(dtype).str, len(header))
            record.remember_table(dest, digest.hexdigest(), facts)
        else:
            record.remember_sha256(dest, digest.hexdigest())
    hold("extract")
    return size


def _stream_cast(
    ref: TensorRef,
    src,
    n: int,
    dtype: str,
    sink,
    writer,
    on_bytes,
    stop: threading.Event,
    on_read: Callable[[int], None] | None = None,
) -> None:
    """Read, cast and check chunk k+1 while chunk k is being written."""
    src_dtype = np.dtype(ref.info.storage_dtype)
    chunk = min(n, _CHUNK_ELEMS)
    cols = ref.shape[-1]
    merged = None
    if ref.delta is not None:  # a merged update is added by whole rows, in one reused buffer
        chunk = min(n, max(cols, chunk - chunk % cols))
        merged = np.empty(chunk, dtype=np.float32)
    raw = np.empty(chunk, dtype=src_dtype)
    scratch = np.empty(chunk, dtype=np.uint16)
    outs = [np.empty(chunk, dtype=dtype), np.empty(chunk, dtype=dtype)]
    pending: list = [None, None]
    src.seek(ref.offset)
    done = k = 0
    while done < n:
        if stop.is_set():
            raise KeyboardInterrupt
        m = min(chunk, n - done)
        if src.readinto(memoryview(raw[:m]).cast("B")) != m * src_dtype.itemsize:
            raise InputError(
                f"tensor {ref.name!r} ends early",
                path=ref.path,
                hint="the file is truncated or corrupt; download it again",
            )
        if on_read is not None:
            on_read((done + m) * src_dtype.itemsize)
        out = outs[k % 2]
        if pending[k % 2] is not None:
            pending[k % 2].result()  # that buffer has been written: reuse it
        if merged is not None:
            _merge_rows(ref, raw[:m], done // cols, merged[:m], out[:m], dtype)
        else:
            _cast_rows(raw[:m], ref.dtype, out[:m])
            if not _fits(raw[:m], ref.dtype, out[:m], scratch[:m]):
                _raise_nonfinite(ref, raw[:m], dtype)
        pending[k % 2] = writer.submit(sink.write, out[:m])
        done += m
        k += 1
        on_bytes(m * src_dtype.itemsize)
    for job in pending:
        if job is not None:
            job.result()


def _merge_rows(ref: TensorRef, raw: np.ndarray, row: int, work: np.ndarray, out: np.ndarray,
                dtype: str) -> None:  # fmt: skip
    """Source rows from ROW plus the merged LoRA update (float32, in WORK), cast into OUT;
    refused when the sum is not finite in DTYPE."""
    ref.delta.merged(raw, ref.dtype, row, out=work.reshape(-1, ref.shape[-1]))
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(out, work, casting="unsafe")
    if not np.isfinite(out).all():
        raise NumericError(
            f"tensor {ref.name!r} with the LoRA update merged has values a {dtype} table "
            "cannot hold",
            path=ref.path,
            hint="lower the adapter's scale (--merge-lora ADAPTER:SCALE)",
        )


def _raise_nonfinite(ref: TensorRef, raw: np.ndarray, dtype: str) -> None:
    if not np.isfinite(to_f32(raw, ref.dtype)).all():
        raise NumericError(
            f"tensor {ref.name!r} holds NaN or Inf in the source",
            path=ref.path,
            hint="the checkpoint is damaged; download it again",
        )
    raise NumericError(
        f"tensor {ref.name!r} has values beyond the {dtype} range",
        path=ref.path,
        hint="use --npy-dtype float32",
    )


def _planned(shard: list[tuple[str, TensorRef]]) -> list[PlannedTensor]:
    return [
        PlannedTensor(
            name, ref.dtype, ref.shape, ref.nbytes, source=ref.path, source_offset=ref.offset
        )
        for name, ref in shard
    ]


def estimate_bytes(ck: MossCheckpoint, npy_dtype: str, backbone_weights: bool = True) -> int:
    backbone = sum(ref.nbytes for _, ref in ck.backbone_tensors()) if backbone_weights else 0
    item = np.dtype(npy_dtype).itemsize
    tables = sum(int(np.prod(j.source.shape)) * item + 128 for j in npy_jobs(ck))
    tokenizer = sum(p.stat().st_size for p in ck.tokenizer_files)
    return backbone + tables + tokenizer + (1 << 20)


class _Bars:
    """Extract's progress: one bar per source shard (bytes read from it) and one overall,
    advanced from both writer threads."""

    def __init__(
        self, bar: ProgressReporter, shards: list[list[tuple[str, TensorRef]]], jobs: list[NpyJob]
    ):
        self._bar = bar
        self._lock = threading.Lock()
        per_shard: dict[Path, int] = {}
        for _, ref in (pair for shard in shards for pair in shard):
            per_shard[ref.path] = per_shard.get(ref.path, 0) + ref.nbytes
        for job in jobs:
            per_shard[job.source.path] = per_shard.get(job.source.path, 0) + job.source.nbytes
        self._paths = list(per_shard)
        for path, nbytes in per_shard.items():
            bar.start(f"shard:{path}", path.name, nbytes, "B")
        bar.start("total", "extract", sum(per_shard.values()), "B")

    def reporter(self, path: Path) -> Callable[[int], None]:
        """on_bytes for bytes read from the source file at path."""

        def on_bytes(n: int) -> None:
            with self._lock:
                self._bar.advance(f"shard:{path}", n)
                self._bar.advance("total", n)

        return on_bytes

    def finish(self) -> None:
        for path in self._paths:
            self._bar.finish(f"shard:{path}")
        self._bar.finish("total")


def _write_backbone(
    folder: Path,
    shards: list[list[tuple[str, TensorRef]]],
    names: list[str],
    bars: _Bars,
    stop: threading.Event,
) -> int:
    """The backbone's safetensors shards, byte copies of the source tensors."""
    written = 0
    for fname, shard in zip(names, shards, strict=True):
        if stop.is_set():
            raise KeyboardInterrupt
        written += write_streaming(
            folder / fname,
            _planned(shard),
            {"format": "pt"},
            on_bytes=_shard_reporter(shard, bars.reporter),
        )
    return written


def _write_tables(
    jobs: list[NpyJob],
    root: Path,
    npy_dtype: str,
    bars: _Bars,
    stop: threading.Event,
    record: HashRecord | None,
    pages: SourcePages | None,
) -> int:
    """The embedding tables and heads as .npy files, one after the other."""
    return sum(
        write_npy(
            job,
            root / job.relpath,
            npy_dtype,
            bars.reporter(job.source.path),
            stop,
            record,
            pages,
        )
        for job in jobs
    )


def _side_by_side(tasks: list[Callable[[], int]], stop: threading.Event) -> int:
    """Run the tasks on their own threads (one I/O-bound, one CPU-bound); the bytes they
    wrote. The first failure sets ``stop`` so the other task ends soon too."""
    with ThreadPoolExecutor(max_workers=len(tasks), thread_name_prefix="extract") as pool:
        futures = [pool.submit(task) for task in tasks]
        try:
            return sum(f.result() for f in futures)
        except BaseException:
            stop.set()
            raise


def extract(
    model: Path | MossCheckpoint,
    output: Path,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD,
    npy_dtype: str = "float16",
    force: bool = False,
    source_model: str | None = None,
    backbone_weights: bool = True,
    record: HashRecord | None = None,
    source_pages: SourcePages | None = None,
    progress: ProgressReporter | None = None,
) -> ExtractResult:
    """Write the layout of docs/ARCHITECTURE.md §3 for the checkpoint MODEL (a folder, or
    the checkpoint `all` opened) into output.

    With ``backbone_weights=False`` the backbone folder gets only its config and
    tokenizer (for `all`, which converts the backbone straight from the source).
    ``record`` (`all`'s, whose layout and verify look at the tables next) gets each
    table's sha256, taken while writing it, with what the writer checked;
    ``source_pages`` is told of each table's source range as it is read.
    """
    started = time.perf_counter()
    bar = ensure(progress)
    if npy_dtype not in NPY_DTYPES:
        raise UsageError(f"unknown --npy-dtype {npy_dtype!r}", hint="use float16 or float32")
    max_shard = parse_size(max_shard_size)
    ck = as_checkpoint(model)
    output = Path(output)
    if backbone_weights and any(ref.delta is not None for _, ref in ck.backbone_tensors()):
        # the backbone's shards are the source's bytes, copied: an update cannot ride in them
        raise UsageError("a merged LoRA adapter cannot be kept in the extracted backbone's "
                         "bf16 shards", hint="drop --keep-intermediate (the GGUFs hold the "
                         "merged weights)")  # fmt: skip
    jobs = npy_jobs(ck)
    shards = plan_shards(ck.backbone_tensors(), max_shard) if backbone_weights else []

    with Staging(output, force=force) as stage:
        check_free_space(stage.path, estimate_bytes(ck, npy_dtype, backbone_weights), output)
        for sub in (BACKBONE_DIR, EMBEDDING_DIR, LM_HEAD_DIR):
            (stage.path / sub).mkdir()
        bars = _Bars(bar, shards, jobs)
        stop = threading.Event()
        names = _shard_names(len(shards))

        root = stage.path
        written = _side_by_side(
            [
                lambda: _write_backbone(root / BACKBONE_DIR, shards, names, bars, stop),
                lambda: _write_tables(jobs, root, npy_dtype, bars, stop, record, source_pages),
            ],
            stop,
        )
        written += _write_small_files(ck, stage.path, shards, names, npy_dtype, source_model)
        bars.finish()
        stage.commit()

    return ExtractResult(
        output=output,
        backbone_dir=output / BACKBONE_DIR,
        embedding_dir=output / EMBEDDING_DIR,
        lm_head_dir=output / LM_HEAD_DIR,
        backbone_shards=[output / BACKBONE_DIR / n for n in names],
        npy_files=[output / j.relpath for j in jobs],
        bytes_written=written,
        seconds=time.perf_counter() - started,
        n_vq=ck.moss.n_vq,
        npy_dtype=npy_dtype,
    )


def _shard_reporter(shard, reporter):
    """Route copied bytes to the bar of the source shard they come from, in copy order."""
    queue = [(ref.path, ref.nbytes) for _, ref in shard]
    state = {"i": 0, "left": queue[0][1] if queue else 0}

    def on_bytes(n: int) -> None:
        while n > 0 and state["i"] < len(queue):
            path = queue[state["i"]][0]
            take = min(n, state["left"])
            reporter(path)(take)
            n -= take
            state["left"] -= take
            if state["left"] == 0:
                state["i"] += 1
                if state["i"] < len(queue):
                    state["left"] = queue[state["i"]][1]

    return on_bytes


def _shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def _write_json(path: Path, data) -> int:
    text = json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    return len(text.encode())


def _write_small_files(
    ck: MossCheckpoint,
    root: Path,
    shards,
    names: list[str],
    npy_dtype: str,
    source_model: str | None,
) -> int:
    backbone = root / BACKBONE_DIR
    written = _write_json(backbone / "config.json", backbone_config(ck))
    if len(shards) > 1:
        weight_map = {
            name: fname for fname, shard in zip(names, shards, strict=True) for name, _ in shard
        }
        total = sum(ref.nbytes for shard in shards for _, ref in shard)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        written += _write_json(backbone / "model.safetensors.index.json", index)
    for path in ck.tokenizer_files:
        shutil.copyfile(path, backbone / path.name)
        written += path.stat().st_size
    meta = {
        "source_model": source_model or str(ck.root),
        "n_vq": ck.moss.n_vq,
        "hidden_size": ck.moss.hidden_size,
        "vocab_size": ck.moss.vocab_size,
        "audio_vocab_size": ck.moss.audio_vocab_size,
        "backbone_dir": BACKBONE_DIR,
        "embedding_dir": EMBEDDING_DIR,
        "lm_head_dir": LM_HEAD_DIR,
        "npy_dtype": npy_dtype,
        "tool": f"moss-gguf {__version__}",
        "moss_config": ck.config,
    }
    written += _write_json(root / META_NAME, meta)
    return written
