"""`all`'s five steps and the state of one run; `pipeline.run.run_all` drives them in order.

Every step has the same two parts: ``plan``, its resume check, made just before it would run
(None: it runs; a string: its output is already complete, and the detail it is skipped with),
and ``run``, which does the work and returns the detail of its row. Extract alone runs in the
background (`ExtractStep.start`), beside convert and quantize.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..disk.digests import HashRecord
from ..disk.layout_names import BACKBONE_DIR, EMBEDDING_DIR, LM_HEAD_DIR, MANIFEST_NAME
from ..disk.page_cache import SourcePages
from ..disk.staging import human_bytes, remove_stale_partials
from ..errors import MossGgufError, NumericError
from ..gguf.file_types import file_type_table
from ..gguf.read import inspect_gguf
from ..hold_points import hold
from ..progress import ProgressReporter
from ..quantize.engines import Companion, Engine, QuantizeRequest
from ..source.audio_tokenizer import AudioTokenizer
from ..source.checkpoint import MossCheckpoint
from ..source.tables import npy_jobs
from .extract import extract
from .layout import LayoutMode, expected_tables, layout, read_meta
from .made_from import MadeFrom
from .verify_failure import require_pass

if TYPE_CHECKING:
    from ..quantize.engines import Quantizer

log = logging.getLogger(__name__)

STEPS = ("extract", "convert", "quantize", "layout", "verify")
# the random tiny model: short runs, every core (its steps are too small for a fixed pool)
_DEMO_SYNTH = {"max_new_tokens": 120, "n_threads": 0}
COMPLETE = "already complete"  # the detail of a step a rerun skips


@dataclass
class AllSettings:
    model: str
    output: Path
    file_types: list[str] = field(default_factory=lambda: ["Q4_K_M"])
    outtype: str = "auto"  # f16, bf16, or auto: f16 unless a tensor overflows it
    engine: str = Engine.AUTO.value  # a quantize.engines.Engine name
    imatrix: Path | None = None
    llama_cpp: Path | None = None
    keep_intermediate: bool = False
    force: bool = False
    revision: str | None = None
    cache_dir: Path | None = None
    audio_tokenizer: str | Path | None = None  # None: the model's own; "none": no codec
    audio_tokenizer_revision: str | None = None
    native_codec: str | None = None  # first-class: the PyTorch tokenizer → codec GGUFs
    threads: int | None = None
    synth: dict[str, Any] = field(default_factory=dict)  # moss-tts.yaml keys to override
    merge_lora: list[str] = field(default_factory=list)  # ADAPTER[:SCALE], merged in order
    force_base: bool = False  # merge an adapter that names another base (warned)


@dataclass
class StepResult:
    name: str
    status: str  # "done" or "skipped"
    seconds: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class EarlierOutputs:
    """What earlier runs left complete, looked at once before any step runs: which steps
    read the source must be known before extract starts (`plan_page_drops`)."""

    extracted: bool  # tables, tokenizer and meta (not looked at once the layout is done)
    intermediate: Path | None  # a complete f16/bf16 GGUF of a wanted type
    quantized: bool  # every requested GGUF


@dataclass
class RunContext:
    """One `all` run: what resolving the settings decided, and what the steps add."""

    settings: AllSettings
    bar: ProgressReporter
    on_step: Callable[[str, int], None] | None
    output: Path
    work: Path  # the hidden work folder beside the output
    file_types: list[str]  # canonical type names, paired with ggufs
    ggufs: list[Path]  # the quantized GGUFs, in the work folder
    checkpoint: MossCheckpoint | None  # opened once in resolve; None once the layout is done
    codec: AudioTokenizer | None  # None also once the layout is done: nothing to add
    quantizer: Quantizer  # the engine chosen (quantize.engines.choose_engine)
    layout_done: bool  # the output is a finished run of these types: only verify runs
    made_from: MadeFrom | None = None  # this run's inputs, recorded in the manifest
    also: Companion | None = None  # first-class GGUFs for the direct engine's same read
    earlier: EarlierOutputs = field(init=False)  # set as the steps start (find_earlier_outputs)
    # what the steps add as they go
    intermediate: Path | None = None  # the f16/bf16 GGUF, found or written
    pages: SourcePages | None = None
    record: HashRecord = field(default_factory=HashRecord)  # files hashed and checked
    steps: list[StepResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    report: object | None = None  # verify's

    @property
    def extracted(self) -> Path:
        return self.work / "extracted"

    @property
    def direct(self) -> bool:
        """The engine quantizes straight from the checkpoint: no convert, no intermediate."""
        return self.quantizer.choice.from_checkpoint

    @property
    def is_tiny(self) -> bool:
        return self.settings.model.startswith("builtin:")

    def find_earlier_outputs(self) -> None:
        """Fill in `earlier` (and the intermediate a previous run left)."""
        wanted = ("f16", "bf16") if self.settings.outtype == "auto" else (self.settings.outtype,)
        candidates = (self.work / f"backbone_{t}.gguf" for t in wanted)
        intermediate = next((p for p in candidates if _gguf_complete(p)), None)
        pairs = zip(self.ggufs, self.file_types, strict=True)
        quantized = all(_gguf_complete(g, t) for g, t in pairs)
        extracted = not self.layout_done and _extract_complete(self.extracted)
        self.earlier = EarlierOutputs(extracted, intermediate, quantized)
        self.intermediate = intermediate

    def begin(self, name: str) -> float:
        """Announce step NAME (callback, bar); its start time."""
        index = STEPS.index(name)
        if self.on_step:
            self.on_step(name, index)
        self.bar.advance("steps", 0, description=f"{name} ({index + 1}/{len(STEPS)})")
        return time.perf_counter()

    def done(self, name: str, started: float, detail: str = "") -> None:
        self.steps.append(StepResult(name, "done", time.perf_counter() - started, detail))
        self.bar.advance("steps", 1)

    def skipped(self, name: str, detail: str = COMPLETE) -> None:
        self.steps.append(StepResult(name, "skipped", 0.0, detail))
        self.bar.advance("steps", 1)

    def run(self, step: Step) -> None:
        """STEP here and now, or its skipped row when its output is already complete."""
        detail = step.plan(self)
        if detail is not None:
            self.skipped(step.name, detail)
            return
        started = self.begin(step.name)
        self.done(step.name, started, step.run(self))


class Step:
    """One step of `all`: ``plan`` is its resume check, ``run`` its work."""

    name: ClassVar[str]

    def plan(self, ctx: RunContext) -> str | None:
        """None: the step runs; else the detail it is skipped with."""
        raise NotImplementedError

    def run(self, ctx: RunContext) -> str:
        """Do the step; return the detail of its row."""
        raise NotImplementedError


class ExtractStep(Step):
    """Tables, tokenizer and meta (the backbone weights only if kept). It hashes its tables
    as it writes them, so that layout's manifest need not read them."""

    name = "extract"

    def plan(self, ctx: RunContext) -> str | None:
        return COMPLETE if ctx.layout_done or ctx.earlier.extracted else None

    def start(self, ctx: RunContext) -> Background | None:
        """Skip, or begin and go on in the background (None: skipped)."""
        detail = self.plan(ctx)
        if detail is not None:
            ctx.skipped(self.name, detail)
            return None
        started = ctx.begin(self.name)
        remove_stale_partials(ctx.extracted)
        return Background(ctx, self, started)

    def run(self, ctx: RunContext) -> str:
        r = extract(
            ctx.checkpoint,
            ctx.extracted,
            force=True,
            source_model=ctx.settings.model,
            backbone_weights=ctx.settings.keep_intermediate,
            record=ctx.record,
            source_pages=ctx.pages,
            progress=ctx.bar,
        )
        return f"{len(r.npy_files)} tables, {human_bytes(r.bytes_written)}"


class Background:
    """A step's ``run`` on its own thread at the lowest CPU priority, so that convert and
    quantize, which decide the wall time, keep the cores and it takes what they leave idle.
    Its row is added at once; its time and detail are filled in when it ends (`finish`)."""

    def __init__(self, ctx: RunContext, step: Step, started: float) -> None:
        def work() -> tuple[str, float]:
            _yield_cpu()
            detail = step.run(ctx)
            return detail, time.perf_counter() - started

        self._bar = ctx.bar
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=step.name)
        self._future = pool.submit(work)
        pool.shutdown(wait=False)
        self._row = StepResult(step.name, "done")
        ctx.steps.append(self._row)

    def wait_quietly(self) -> None:
        """Let it end without raising: a later step failed, and that is the error to report."""
        if self._future.done():
            return
        try:
            self._future.result()
        except BaseException:  # noqa: BLE001 - the first failure is the one to report
            pass

    def finish(self) -> None:
        """Wait for it (raising its error) and fill its row in."""
        self._row.detail, self._row.seconds = self._future.result()
        self._bar.advance("steps", 1)


class ConvertStep(Step):
    """The backbone to one f16/bf16 GGUF, straight from the source shards (two-pass engines;
    auto falls back to bf16 when f16 would overflow)."""

    name = "convert"

    def plan(self, ctx: RunContext) -> str | None:
        if ctx.direct:  # the direct engine reads the source once for every type
            return "not needed: quantized straight from the checkpoint"
        earlier = ctx.earlier
        if ctx.layout_done or earlier.quantized or earlier.intermediate is not None:
            return COMPLETE
        return None

    def run(self, ctx: RunContext) -> str:
        from .convert import convert

        outtype = "f16" if ctx.settings.outtype == "auto" else ctx.settings.outtype
        try:
            r = convert(
                ctx.checkpoint,
                ctx.work / f"backbone_{outtype}.gguf",
                outtype=outtype,
                force=True,
                progress=ctx.bar,
                source_pages=ctx.pages,
            )
        except NumericError as exc:
            if ctx.settings.outtype != "auto":
                raise
            ctx.notes.append(f"f16 would overflow ({exc.message}); converted to bf16 instead")
            log.warning(ctx.notes[-1])
            r = convert(
                ctx.checkpoint, ctx.work / "backbone_bf16.gguf", outtype="bf16", force=True,
                progress=ctx.bar,
            )  # fmt: skip
        ctx.intermediate = r.outfile
        return f"{r.outfile.name}, {human_bytes(r.bytes_written)}"


class QuantizeStep(Step):
    """Every requested type not yet complete: the direct engine from the checkpoint in one
    read, a two-pass one from the intermediate GGUF."""

    name = "quantize"

    def __init__(self) -> None:
        self._todo: list[tuple[Path, str]] = []

    def plan(self, ctx: RunContext) -> str | None:
        if ctx.layout_done:
            return COMPLETE
        # looked at now, not with `earlier`: after convert, which wrote what quantize reads
        pairs = zip(ctx.ggufs, ctx.file_types, strict=True)
        self._todo = [(g, q) for g, q in pairs if not _gguf_complete(g, q)]
        return None if self._todo else COMPLETE

    def run(self, ctx: RunContext) -> str:
        settings = ctx.settings
        request = QuantizeRequest(
            self._todo, ctx.checkpoint, ctx.intermediate, settings.outtype, ctx.work,
            imatrix=settings.imatrix, threads=settings.threads,
            keep_intermediate=settings.keep_intermediate, pages=ctx.pages, record=ctx.record,
            also=ctx.also if ctx.direct else None,
        )  # fmt: skip
        q = ctx.quantizer.quantize(request, force=True, progress=ctx.bar)
        results, ctx.intermediate = q.results, q.intermediate
        ctx.notes += q.notes
        fallbacks = sum(len(r.fallbacks) for r in results)
        how = " in one read of the checkpoint" if ctx.direct else ""
        return (
            ", ".join(f"{r.output.name} {r.bpw:.2f} bpw" for r in results)
            + how
            + (f"; {fallbacks} fallback tensor types" if fallbacks else "")
        )


class LayoutStep(Step):
    """Hard links from the work folder (same filesystem, so no copies), the synth config and
    the manifest, renamed into place. The work folder (all but the intermediate GGUF) stays
    until the end, so a run killed here resumes at this step."""

    name = "layout"

    def plan(self, ctx: RunContext) -> str | None:
        return COMPLETE if ctx.layout_done else None

    def run(self, ctx: RunContext) -> str:
        r = layout(
            ctx.extracted,
            ctx.ggufs,
            ctx.output,
            mode=LayoutMode.link,
            audio_tokenizer=ctx.codec,
            synth_overrides={**(_DEMO_SYNTH if ctx.is_tiny else {}), **ctx.settings.synth} or None,
            source_model=ctx.settings.model,
            made_from=ctx.made_from,
            force=True,
            progress=ctx.bar,
            record=ctx.record,
        )
        return f"{len(r.entries)} files"


class VerifyStep(Step):
    """verify's fast checks of the finished folder: on every run, a rerun included."""

    name = "verify"

    def plan(self, ctx: RunContext) -> str | None:
        return None

    def run(self, ctx: RunContext) -> str:
        hold("verify")
        ctx.report, detail = verify_folder(ctx.output, ctx.bar, ctx.record)
        return detail


def plan_page_drops(ctx: RunContext, extracting: bool) -> SourcePages | None:
    """The source ranges extract and the backbone's reader (convert, or the direct quantize)
    will read, each reader announced, so that each drops what it has read once the other is
    past it; None when nothing reads the source or extract also copies the backbone."""
    earlier = ctx.earlier
    # convert runs, or the direct quantize: either reads the backbone from the source
    converted = not ctx.direct and earlier.intermediate is not None
    reads_backbone = not (ctx.layout_done or earlier.quantized or converted)
    if not (extracting or reads_backbone) or ctx.settings.keep_intermediate:
        return None
    ck = ctx.checkpoint
    pages = SourcePages()
    if extracting:
        pages.expect(
            "extract", ((j.source.path, j.source.offset, j.source.nbytes) for j in npy_jobs(ck))
        )
    if reads_backbone:
        # the direct engine's joint pass reads the whole checkpoint (the first-class GGUFs)
        joint = ctx.also is not None and ctx.direct
        refs = ck.tensors.values() if joint else (r for _, r in ck.backbone_tensors())
        pages.expect("convert", ((r.path, r.offset, r.nbytes) for r in refs))
    return pages


def verify_folder(
    output: Path, progress: ProgressReporter, record: HashRecord
) -> tuple[object, str]:
    """verify's fast checks of a finished folder, taking what RECORD says the run's writers
    hashed and checked; raises VerifyFailed on a failing row (its caller decides what becomes
    of the folder: verify_failure.py). (report, detail)"""
    # lazy: an import error of verify/ fails this step, never reads as "done"
    from ..verify import CODEC_ROW, verify

    report = verify(output, progress=progress, record=record)
    silent = json.loads((output / MANIFEST_NAME).read_text()).get("audio_tokenizer", "?") is None
    # a folder made without a codec fails verify's codec row by design; all else must pass
    require_pass(output, report.rows, frozenset({CODEC_ROW} if silent else ()))
    return report, ("all checks pass" if not silent else "all checks pass but the codec's")


def _extract_complete(folder: Path) -> bool:
    """The extract output is there with every table readable and of the right size."""
    try:
        meta = read_meta(folder)
    except MossGgufError:
        return False
    emb, heads = expected_tables(meta["n_vq"])
    for sub, names in ((EMBEDDING_DIR, emb), (LM_HEAD_DIR, heads)):
        for name in names:
            path = folder / sub / name
            try:
                arr = np.load(path, mmap_mode="r")
            except (OSError, ValueError):
                return False
            del arr  # np.load refuses a file shorter than its header says
    return (folder / BACKBONE_DIR / "tokenizer.json").is_file()


def _gguf_complete(path: Path, file_type: str | None = None) -> bool:
    """A GGUF whose data is all there (and of FILE_TYPE, when given)."""
    if not path.is_file():
        return False
    try:
        info = inspect_gguf(path)
    except MossGgufError:
        return False
    if info.size < info.data_end:
        return False
    if file_type is not None:
        return info.file_type == file_type_table().get(file_type)
    return True


def _yield_cpu() -> None:
    """Lowest CPU priority for the calling thread and the threads it starts (Linux: nice is
    per thread and inherited); elsewhere a no-op."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
