"""Quantize a GGUF with llama.cpp: the `llama-quantize` binary or libllama in-process.

Both engines run llama.cpp's own quantizer (`llama_model_quantize`), so with the same
llama.cpp version their outputs are byte-identical to a plain `llama-quantize` run.
Their per-tensor log lines drive the progress reporter and fill the result rows.

Outputs are written to a hidden temporary name beside the target and renamed only when
llama.cpp has finished; any failure or Ctrl-C removes the temporary file.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..disk.staging import check_target, staged_file
from ..errors import InputError, OutputError, ToolError, UsageError
from ..gguf.file_types import file_type_table, parse_file_type
from ..gguf.imatrix import OVERRIDE_STR_BYTES, ImatrixData, imatrix_kvs, load_imatrix
from ..gguf.read import GgufInfo, inspect_gguf  # the one GGUF header reader
from ..hold_points import hold
from ..native import libllama
from ..native import llama_tools as lc
from ..progress import ProgressReporter, ensure
from .engines import (
    GGUF_ENGINES,
    Choice,
    Engine,
    Quantized,
    QuantizeRequest,
    QuantizeResult,
    choose_engine,
    parse_engine,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- type names

# ggml types that cannot be a quantization target for a weight
_NOT_TARGET_TENSOR_TYPES = {"Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"}
# tensor types that are not quantized (requantizing is only about the others)

# rough bits per weight of llama.cpp file types, for the disk plan (unknown types: 16)
APPROX_BPW = {
    "Q2_K": 3.0,
    "Q3_K_S": 3.5,
    "Q3_K_M": 3.9,
    "Q3_K_L": 4.3,
    "Q4_0": 4.6,
    "Q4_1": 5.0,
    "Q4_K_S": 4.6,
    "Q4_K_M": 4.9,
    "Q5_0": 5.5,
    "Q5_1": 6.0,
    "Q5_K_S": 5.6,
    "Q5_K_M": 5.7,
    "Q6_K": 6.6,
    "Q8_0": 8.5,
    "F16": 16,
    "BF16": 16,
    "F32": 32,
}


@functools.lru_cache(maxsize=1)
def tensor_types() -> dict[str, int]:
    """ggml tensor types usable for --token-embedding-type / --output-tensor-type."""
    import gguf

    return {
        m.name: int(m.value)
        for m in gguf.GGMLQuantizationType
        if m.name not in _NOT_TARGET_TENSOR_TYPES
    }


def parse_tensor_type(name: str, option: str) -> str:
    table = tensor_types()
    key = name.strip().upper()
    if key not in table:
        raise UsageError(
            f"unknown tensor type {name!r} for {option}",
            hint=f"valid types (any case): {', '.join(table)}",
        )
    return key


def output_name(input: Path, file_type: str) -> str:
    """`backbone_f16.gguf` + Q4_K_M -> `backbone_q4_k_m.gguf` (a float suffix is dropped)."""
    stem = Path(input).name
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    stem = re.sub(r"[-_.](f16|bf16|f32|fp16|fp32|float16|float32)$", "", stem, flags=re.I)
    return f"{stem or 'model'}_{file_type.lower()}.gguf"


# --------------------------------------------------------------------------- settings/results


@dataclass
class QuantizeSettings:
    """Everything besides input and outputs; names equal the CLI options."""

    engine: Engine = Engine.AUTO
    llama_cpp: Path | None = None
    imatrix: Path | None = None
    threads: int | None = None
    token_embedding_type: str | None = None
    output_tensor_type: str | None = None
    allow_requantize: bool = False
    pure: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantizeSettings:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise UsageError(f"unknown quantize settings: {', '.join(sorted(unknown))}")
        values = dict(data)
        if "engine" in values:
            values["engine"] = parse_engine(values["engine"], GGUF_ENGINES)
        for key in ("llama_cpp", "imatrix"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        return cls(**values)


@dataclass
class QuantizeJob:
    """One planned run: what `--dry-run` shows."""

    input: Path
    output: Path
    file_type: str
    file_type_id: int  # its llama_ftype value
    engine: Engine  # BINARY or LIBRARY, never AUTO
    command: list[str]  # the llama-quantize argv (for the library: the same arguments)
    settings: QuantizeSettings  # with canonical type names


# --------------------------------------------------------------------------- planning


def quantize_command(
    exe: str, input: Path, output: Path, file_type: str, s: QuantizeSettings
) -> list[str]:
    """The llama-quantize command line for one output (also what the library engine runs)."""
    return lc.build_quantize_cmd(
        exe,
        input,
        output,
        file_type,
        threads=s.threads,
        imatrix=s.imatrix,
        token_embedding_type=s.token_embedding_type,
        output_tensor_type=s.output_tensor_type,
        allow_requantize=s.allow_requantize,
        pure=s.pure,
    )


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def _canonical_types(types: str | Sequence[str]) -> list[str]:
    """The requested file types as canonical names, each once, in the order given."""
    names = [types] if isinstance(types, str) else list(types)
    if not names:
        raise UsageError("no quantization type given", hint="e.g. Q4_K_M")
    canon: list[str] = []
    for n in names:
        c = parse_file_type(n)
        if c not in canon:
            canon.append(c)
    return canon


def _output_paths(
    input: Path,
    output: Path | Sequence[Path] | None,
    output_dir: Path | None,
    canon: list[str],
) -> list[Path]:
    """One output path per type: the ones given, or named by output_name in a folder."""
    if output is not None and output_dir is not None:
        raise UsageError("give either an output file or --output-dir, not both")
    if output_dir is not None:
        return [Path(output_dir) / output_name(input, t) for t in canon]
    if output is None:
        return [input.parent / output_name(input, t) for t in canon]
    outputs = [Path(output)] if isinstance(output, (str, os.PathLike)) else list(output)
    outputs = [Path(o) for o in outputs]
    if len(outputs) != len(canon):
        raise UsageError(
            f"{len(canon)} types but {len(outputs)} output file(s)",
            hint="with several types use --output-dir DIR",
        )
    return outputs


def _check_outputs(input: Path, outputs: list[Path], force: bool) -> None:
    """Refuse outputs that are the input, a folder, taken (without force) or given twice."""
    for out in outputs:
        if _same_file(out, input):
            raise UsageError(
                "the output path is the input file",
                path=out,
                hint="choose another output name; the input is never overwritten",
            )
        if out.is_dir():
            raise OutputError(
                "output is a folder", path=out, hint="give a file name, or use --output-dir"
            )
        check_target(out, force, kind="file")
    if len(set(o.resolve() for o in outputs)) != len(outputs):
        raise UsageError("two types would write the same output file")


def _check_input(input: Path, info: GgufInfo, s: QuantizeSettings) -> None:
    """Refuse an already quantized input (unless allowed) and a missing importance matrix."""
    quantized = info.quantized_types
    if quantized and not s.allow_requantize:
        raise InputError(
            f"input is already quantized ({', '.join(quantized)} tensors)",
            path=input,
            hint="quantize the f16/bf16/f32 GGUF instead, or pass --allow-requantize "
            "(lower quality)",
        )
    if s.imatrix is not None and not Path(s.imatrix).is_file():
        raise InputError("importance matrix file not found", path=s.imatrix, hint="check --imatrix")


def plan_quantize(
    input: Path,
    output: Path | Sequence[Path] | None = None,
    types: str | Sequence[str] = ("Q4_K_M",),
    *,
    output_dir: Path | None = None,
    settings: QuantizeSettings | None = None,
    force: bool = False,
) -> tuple[GgufInfo, list[QuantizeJob]]:
    """Check everything that can be checked before work starts; return the jobs."""
    s = settings or QuantizeSettings()
    engine = parse_engine(s.engine, GGUF_ENGINES)
    canon = _canonical_types(types)
    tok_type = (
        parse_tensor_type(s.token_embedding_type, "--token-embedding-type")
        if s.token_embedding_type
        else None
    )
    out_type = (
        parse_tensor_type(s.output_tensor_type, "--output-tensor-type")
        if s.output_tensor_type
        else None
    )
    if s.threads is not None and s.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {s.threads}")

    input = Path(input)
    outputs = _output_paths(input, output, output_dir, canon)
    info = inspect_gguf(input)
    _check_outputs(input, outputs, force)
    _check_input(input, info, s)

    choice = choose_engine(engine, s.llama_cpp, checkpoint=False)
    resolved, exe = choice.engine, choice.binary
    # canonical names from here on; the library engine shows the equivalent llama-quantize
    s = replace(s, engine=resolved, token_embedding_type=tok_type, output_tensor_type=out_type)
    exe_name = str(exe) if exe is not None else lc.QUANTIZE_BIN
    table = file_type_table()
    jobs = [
        QuantizeJob(
            input, out, t, table[t], resolved, quantize_command(exe_name, input, out, t, s), s
        )
        for t, out in zip(canon, outputs, strict=True)
    ]
    return info, jobs


# --------------------------------------------------------------------------- running


def quantize(
    input: Path,
    output: Path | Sequence[Path] | None = None,
    types: str | Sequence[str] = ("Q4_K_M",),
    *,
    output_dir: Path | None = None,
    engine: Engine | str = Engine.AUTO,
    llama_cpp: Path | None = None,
    imatrix: Path | None = None,
    threads: int | None = None,
    token_embedding_type: str | None = None,
    output_tensor_type: str | None = None,
    allow_requantize: bool = False,
    pure: bool = False,
    force: bool = False,
    progress: ProgressReporter | None = None,
) -> list[QuantizeResult]:
    """Quantize INPUT to one file per type; return one result per type, in order.

    ``output`` is one path (one type) or a list paired with ``types``; or give
    ``output_dir`` (files named by :func:`output_name`); with neither, files go beside
    the input.
    """
    settings = QuantizeSettings(
        engine=parse_engine(engine),
        llama_cpp=Path(llama_cpp) if llama_cpp is not None else None,
        imatrix=Path(imatrix) if imatrix is not None else None,
        threads=threads,
        token_embedding_type=token_embedding_type,
        output_tensor_type=output_tensor_type,
        allow_requantize=allow_requantize,
        pure=pure,
    )
    info, jobs = plan_quantize(
        input, output, types, output_dir=output_dir, settings=settings, force=force
    )
    progress = ensure(progress)
    # read for both engines: a bad file fails here, the same way, before any work
    imatrix_data = load_imatrix(settings.imatrix) if settings.imatrix is not None else None
    return [_run_job(job, info, imatrix_data, force, progress) for job in jobs]


@dataclass
class LlamaQuantizer:
    """The binary and library engines as `all` runs them: llama.cpp's quantizer on the
    intermediate GGUF, one output at a time."""

    choice: Choice
    llama_cpp: Path | None = None

    def quantize(
        self, request: QuantizeRequest, force: bool, progress: ProgressReporter
    ) -> Quantized:
        if request.intermediate is None:
            raise UsageError("the two-pass engines quantize a GGUF: convert first")
        results = quantize(
            request.intermediate,
            [g for g, _ in request.outputs],
            [q for _, q in request.outputs],
            engine=self.choice.engine,
            llama_cpp=self.llama_cpp,
            imatrix=request.imatrix,
            threads=request.threads,
            force=force,
            progress=progress,
        )
        return Quantized(results, request.intermediate)


def _progress_feed(
    parser: lc.QuantizeLogParser, progress: ProgressReporter, key: str, label: str
) -> Callable[[str], None]:
    """A sink for llama.cpp's log text: debug log lines, the parser's rows, progress."""

    def on_text(text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                log.debug("llama.cpp: %s", line)
        for ev in parser.feed(text):
            if isinstance(ev, lc.TensorStarted):
                progress.advance(key, 0, description=f"{label} {ev.name} {ev.src_type}")
            elif isinstance(ev, lc.TensorConverting):
                desc = f"{label} {ev.name} {ev.src_type}→{ev.dst_type}"
                progress.advance(key, 0, description=desc)
            elif isinstance(ev, lc.TensorDone):
                r = ev.row
                change = f"{r.src_type}→{r.dst_type}" if r.converted else f"{r.src_type} (copy)"
                progress.advance(key, 1, description=f"{label} {r.name} {change}")
                hold("quantize")

    return on_text


def _run_engine(
    job: QuantizeJob,
    tmp: Path,
    imatrix_data: ImatrixData | None,
    parser: lc.QuantizeLogParser,
    on_text: Callable[[str], None],
) -> str:
    """Quantize job.input into tmp with the job's engine; returns which llama.cpp did it."""
    s = job.settings
    if job.engine is Engine.BINARY:
        cmd = quantize_command(job.command[0], job.input, tmp, job.file_type, s)
        run = lc.run_streaming(cmd, on_text)
        parser.close()
        if run.returncode != 0:
            raise ToolError(
                f"llama-quantize failed (exit {run.returncode}): {lc.last_lines(run.tail)}",
                path=job.input,
            )
        return parser.build.describe() if parser.build else f"binary {cmd[0]}"
    rc = library_quantize(job, tmp, s, imatrix_data, on_text)
    parser.close()
    if rc != 0:
        raise ToolError(
            f"llama_model_quantize failed (code {rc}): {lc.last_lines(list(parser.lines))}",
            path=job.input,
        )
    v = lc.library_version()
    return v.describe() if v else "llama-cpp-python"


def _result(
    job: QuantizeJob,
    info: GgufInfo,
    parser: lc.QuantizeLogParser,
    version: str | None,
    seconds: float,
) -> QuantizeResult:
    """The finished job's figures: sizes, bits per weight (llama.cpp's own when it logged
    them), the tensor rows and fallbacks."""
    out_bytes = job.output.stat().st_size
    n_el = max(info.n_elements, 1)
    in_bpw = parser.model_bpw if parser.model_bpw is not None else info.size * 8 / n_el
    bpw = parser.quant_bpw if parser.quant_bpw is not None else out_bytes * 8 / n_el
    return QuantizeResult(
        input=job.input,
        output=job.output,
        file_type=job.file_type,
        engine=job.engine.value,
        command=job.command,
        input_bytes=info.size,
        output_bytes=out_bytes,
        n_elements=info.n_elements,
        input_bpw=in_bpw,
        bpw=bpw,
        seconds=seconds,
        tensors=parser.rows,
        fallbacks=parser.fallbacks,
        llama_cpp=version,
        log_tail=list(parser.lines)[-20:],
    )


def _run_job(
    job: QuantizeJob,
    info: GgufInfo,
    imatrix_data: ImatrixData | None,
    force: bool,
    progress: ProgressReporter,
) -> QuantizeResult:
    parser = lc.QuantizeLogParser()
    key = f"quantize:{job.file_type}"
    label = f"{job.file_type}"
    progress.start(key, label, total=info.n_tensors, unit="tensors")
    on_text = _progress_feed(parser, progress, key, label)
    start = time.perf_counter()
    try:
        # the temporary name becomes the output only once llama.cpp has finished
        with staged_file(job.output, force=force) as tmp:
            version = _run_engine(job, tmp, imatrix_data, parser, on_text)
            if not tmp.is_file() or tmp.stat().st_size == 0:
                raise ToolError("llama.cpp reported success but wrote no output", path=job.output)
        progress.advance(key, 0, description=f"{label} done")
    finally:
        progress.finish(key)
    return _result(job, info, parser, version, time.perf_counter() - start)


# --------------------------------------------------------------------------- library engine

def _quantize_params(
    job: QuantizeJob, s: QuantizeSettings, imatrix_data: ImatrixData | None, dry_run: bool
) -> tuple[Any, list[Any]]:
    """llama_model_quantize_params for the job, and the arrays they point into (which must
    outlive the call)."""
    llama_cpp = libllama.bindings()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = job.file_type_id
    params.nthread = s.threads or 0
    ttypes = tensor_types()
    if s.token_embedding_type:
        params.token_embedding_type = ttypes[s.token_embedding_type.upper()]
    if s.output_tensor_type:
        params.output_tensor_type = ttypes[s.output_tensor_type.upper()]
    params.allow_requantize = bool(s.allow_requantize)
    params.pure = bool(s.pure)
    params.dry_run = bool(dry_run)
    keep: list[Any] = []
    if imatrix_data is not None:
        _attach_imatrix(params, imatrix_data, str(s.imatrix), keep)
    return params, keep


def library_quantize(
    job: QuantizeJob,
    out: Path,
    s: QuantizeSettings,
    imatrix_data: ImatrixData | None,
    on_text: Callable[[str], None],
    dry_run: bool = False,
) -> int:
    """llama_model_quantize in a worker thread; its log reaches on_text on this thread.

    With ``dry_run`` llama.cpp only decides and logs each tensor's type; it reads no tensor
    data and writes nothing.
    """
    import ctypes

    llama_cpp = libllama.bindings()
    llama_cpp.llama_backend_init()
    params, keep = _quantize_params(job, s, imatrix_data, dry_run)
    return _call_with_log(
        lambda: llama_cpp.llama_model_quantize(
            str(job.input).encode(), str(out).encode(), ctypes.byref(params)
        ),
        on_text,
        keep,
    )


def _call_with_log(call: Callable[[], int], on_text: Callable[[str], None], keep: Any) -> int:
    """call() in a worker thread with libllama's log routed to on_text on this thread.

    A worker keeps this thread free to report progress and to take Ctrl-C (an exception
    raised inside a ctypes callback would be swallowed). ``keep`` is what the call's
    arguments point into: kept alive for good if the call is interrupted.
    """
    texts: queue.SimpleQueue[str] = queue.SimpleQueue()
    active = threading.Event()
    active.set()

    def on_log(level: int, text: bytes) -> None:
        if active.is_set() and text:
            texts.put(text.decode("utf-8", "replace"))

    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["rc"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            result["exc"] = exc

    def drain() -> None:
        while True:
            try:
                on_text(texts.get_nowait())
            except queue.Empty:
                return

    hook = libllama.route_log(on_log)
    worker = threading.Thread(target=work, name="llama_model_quantize", daemon=True)
    finished = False
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            drain()
        drain()
        finished = True
    finally:
        active.clear()
        if finished:
            libllama.restore_log(hook)
        else:
            # interrupted: the worker cannot be stopped; it keeps writing to a file that
            # staged_file is about to delete, and dies with the process
            libllama.hold_for_good(keep)
    if "exc" in result:
        raise result["exc"]
    return int(result.get("rc", 1))


# --------------------------------------------------------------------------- importance matrix


def _attach_imatrix(params: Any, data: ImatrixData, file_arg: str, keep: list[Any]) -> None:
    """Fill params.imatrix and the quantize.imatrix.* metadata as llama-quantize does."""
    import ctypes

    llama_cpp = libllama.bindings()
    n = len(data.entries)
    arr = (llama_cpp.llama_model_imatrix_data * (n + 1))()
    for i, (name, values) in enumerate(data.entries.items()):
        buf = np.ascontiguousarray(values, dtype=np.float32)
        name_b = name.encode()
        keep += [buf, name_b]
        arr[i].name = name_b
        arr[i].data = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        arr[i].size = buf.size
    keep.append(arr)
    params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))

    kvs = [
        (key, llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR if isinstance(value, str)
         else llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, value)
        for key, value in imatrix_kvs(data, file_arg)
    ]  # fmt: skip
    ov = (llama_cpp.llama_model_kv_override * (len(kvs) + 1))()
    for i, (key, tag, value) in enumerate(kvs):
        ov[i].key = key.encode()
        ov[i].tag = tag
        if tag == llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR:
            ov[i].value.val_str = value.encode()[:OVERRIDE_STR_BYTES]
        else:
            ov[i].value.val_i64 = int(value)
    keep.append(ov)
    params.kv_overrides = ctypes.cast(ov, ctypes.POINTER(llama_cpp.llama_model_kv_override))
