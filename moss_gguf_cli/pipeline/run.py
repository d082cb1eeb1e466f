"""`all`: extract → convert → quantize → layout → verify, as one resumable run.

Work happens in a hidden folder beside the output (``.NAME.work``). Each step
writes atomically, so a step's output either exists complete or not at all; a
rerun skips every step whose output exists and passes a quick check, and redoes
the rest. The backbone is converted straight from the source shards, so no
intermediate safetensors copy is written unless asked for.

`run_all` reads top to bottom: resolve the settings (checks and pre-flight, in the
order that fails fastest), run the steps of `pipeline.steps` in order, finish (the work
folder removed or kept). A final verify that fails removes what the run wrote
(pipeline/verify_failure.py). Pre-converted weights take `run_preconverted` instead, a
first-class GGUF `run_from_first_class`: pipeline/route.py chooses, once.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..disk.digests import HashRecord
from ..disk.layout_names import AUDIO_TOKENIZER_DIR, CONFIG_NAME, MANIFEST_NAME, META_NAME
from ..disk.staging import human_bytes
from ..doctor import preflight
from ..errors import InputError, OutputError, UsageError
from ..gguf.file_types import parse_file_type
from ..progress import ProgressReporter, ensure
from ..quantize.engines import Companion, Quantizer, choose_engine, parse_engine
from ..quantize.llama import APPROX_BPW, LlamaQuantizer, output_name
from ..source.audio_tokenizer import AudioTokenizer
from ..source.audio_tokenizer import default_source as default_codec
from ..source.audio_tokenizer import resolve as resolve_codec
from ..source.checkpoint import MossCheckpoint, as_checkpoint, open_checkpoint, resolve_model
from ..source.hub import is_repo_id
from ..source.hub import locate as locate_repo
from ..source.lora import AdapterSpec, base_mismatch, merged, open_adapter, plan_merge
from ..source.preconverted import GgufRepo, choose, derive_meta, fetch, write_meta
from ..source.tables import npy_jobs
from .from_first_class import FirstClassInput, unpack
from .layout import Placement, arrange, audio_tokenizer_files
from .made_from import (
    RECORD_NAME,
    WORK_KEYS,
    MadeFrom,
    file_sha256,
    folder_identity,
    manifest_made_from,
    read_record,
    refuse_other,
    source_identity,
    write_record,
)
from .steps import (
    STEPS,
    AllSettings,
    ConvertStep,
    ExtractStep,
    LayoutStep,
    QuantizeStep,
    RunContext,
    StepResult,
    VerifyStep,
    plan_page_drops,
    verify_folder,
)
from .verify_failure import Written, removed_if_verify_fails

log = logging.getLogger(__name__)

__all__ = [
    "STEPS", "AllResult", "AllSettings", "StepResult",
    "plan_bytes", "run_all", "run_from_first_class", "run_preconverted", "work_dir",
]  # fmt: skip


@dataclass
class AllResult:
    output: Path
    config: Path
    ggufs: list[Path]
    steps: list[StepResult]
    files: list[tuple[str, int]]
    intermediate: Path | None
    notes: list[str] = field(default_factory=list)
    verify_report: object | None = None
    speaks: bool = True  # False: no audio tokenizer in the folder yet

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)


def work_dir(output: Path) -> Path:
    return output.parent / f".{output.name}.work"


def plan_bytes(
    model: Path | MossCheckpoint, settings: AllSettings, direct: bool = False
) -> int:
    """Peak disk the run needs: tables + intermediate GGUF (not with the direct engine
    unless kept) + quantized GGUFs (+ kept copy)."""
    ck = as_checkpoint(model)
    backbone_params = sum(int(np.prod(r.shape)) for _, r in ck.backbone_tensors())
    tables = sum(int(np.prod(j.source.shape)) * 2 for j in npy_jobs(ck))
    intermediate = 0 if direct and not settings.keep_intermediate else backbone_params * 2
    bpw = [APPROX_BPW.get(t.upper(), 16) for t in settings.file_types]
    quantized = sum(backbone_params * b / 8 for b in bpw)
    kept = sum(r.nbytes for _, r in ck.backbone_tensors()) if settings.keep_intermediate else 0
    return int(tables + intermediate + quantized + kept) + (64 << 20)


def _layout_complete(output: Path, gguf_names: list[str]) -> bool:
    """A finished weights folder of exactly these GGUFs (sizes as its manifest says)."""
    manifest = output / MANIFEST_NAME
    if not manifest.is_file():
        return False
    try:
        data = json.loads(manifest.read_text())
        if sorted(data["quant_types"]) != sorted(gguf_names):
            return False
        return all((output / f["path"]).stat().st_size == f["size"] for f in data["files"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False


def run_all(
    settings: AllSettings,
    progress: ProgressReporter | None = None,
    on_step: Callable[[str, int], None] | None = None,
    also: Callable[[Path], Companion | None] | None = None,
) -> AllResult:
    """The backend folder from a MOSS checkpoint: run every step that is not already complete;
    return what was made and how long it took (pipeline/route.py chose this route).
    ``also``: given the model's folder once it is resolved (before any work), the first-class
    GGUFs the direct engine is to write in the same read as the backbone's (pipeline/dual.py)."""
    bar = ensure(progress)
    ctx = _resolve(settings, bar, on_step, also)
    with removed_if_verify_fails(_written(ctx)):
        _run_steps(ctx)
    return _finish(ctx)


def _written(ctx: RunContext) -> Written:
    """Whose the output is when verify fails (verify_failure.py): this run's when it lays the
    folder out, or when the run that did left its work folder (it never got past verify: a
    finished run removes it); else a finished earlier run's, only verified by this one."""
    return Written(ctx.output, (ctx.work,), ours=not ctx.layout_done or ctx.work.exists())


# --------------------------------------------------------------------------- before the steps


def _resolve(
    settings: AllSettings,
    bar: ProgressReporter,
    on_step: Callable[[str, int], None] | None,
    also: Callable[[Path], Companion | None] | None = None,
) -> RunContext:
    """Everything before the first step, in the order a user fixes things: the settings, the
    model located (named in the error if it is not there), doctor's pre-flight, the codec, the
    model fetched and its checkpoint opened (once: every step takes it from the context), the
    engine chosen, what the output and the work folder already hold, the disk. Up front, so
    that a run that cannot finish stops before its long work."""
    # lazy: quantize.direct loads ml_dtypes (half a second): only a run that quantizes pays it
    from ..quantize.direct import DirectQuantizer

    output = Path(settings.output)
    file_types = _check_settings(settings)
    work = work_dir(output)
    if settings.force:
        shutil.rmtree(work, ignore_errors=True)
    is_tiny = settings.model.startswith("builtin:")
    locate_model(settings.model, settings.revision, settings.cache_dir)
    ggufs = [work / output_name(Path("backbone_f16.gguf"), q) for q in file_types]
    layout_done = not settings.force and _layout_complete(output, [g.name for g in ggufs])
    codec = checkpoint = None
    if not layout_done:
        _preflight_tools(settings)
        checkpoint = _open_local(settings, is_tiny)  # a look-alike is refused before the codec
        codec = _find_codec(settings, is_tiny, bar)
    model_dir = resolve_model(settings.model, settings.revision, settings.cache_dir, bar)
    if not layout_done and checkpoint is None:
        checkpoint = open_checkpoint(model_dir)
    if codec is not None and settings.audio_tokenizer is None:
        # the model's own codec: refuses a model that speaks at another sampling rate
        default_codec(builtin=is_tiny, sampling_rate=checkpoint.moss.sampling_rate)
    choice = choose_engine(settings.engine, settings.llama_cpp, checkpoint=True)
    quantizer: Quantizer = (
        DirectQuantizer(choice) if choice.from_checkpoint
        else LlamaQuantizer(choice, settings.llama_cpp)
    )  # fmt: skip
    companion = also(model_dir) if also is not None else None  # its refusals come first
    made_from = _made_from(settings, model_dir, is_tiny)
    if settings.merge_lora:  # every adapter checked against the base before any work
        checkpoint, lora = merge_adapters(settings, checkpoint, made_from.source, bar)
        made_from = replace(made_from, lora=lora)
    if layout_done:
        refuse_other(output, manifest_made_from(output), made_from)
    else:
        if not settings.force:
            _refuse_other_output(output, "these quant types")
        _resume_work(work, made_from)
        if not work.exists():  # a resumed run has counted its disk already
            _preflight_disk(checkpoint, settings, output, direct=choice.from_checkpoint)
        work.mkdir(parents=True, exist_ok=True)
        write_record(work / RECORD_NAME, made_from)
    return RunContext(
        settings, bar, on_step, output, work, file_types, ggufs, checkpoint, codec, quantizer,
        layout_done, made_from, companion,
    )  # fmt: skip


def merge_adapters(settings: AllSettings, ck: MossCheckpoint | None, source: dict,
                   bar: ProgressReporter) -> tuple[MossCheckpoint | None, list[dict]]:  # fmt: skip
    """CK with every --merge-lora adapter's update on the tensors it targets (CK None: a
    finished folder, whose record is compared), and the adapters' records for the manifest."""
    adapters = [open_adapter(AdapterSpec.parse(a), settings.cache_dir, bar)
                for a in settings.merge_lora]  # fmt: skip
    for adapter in adapters:
        other = base_mismatch(adapter, source)
        if other and not settings.force_base:
            raise InputError(f"{other}: an adapter for another base", path=adapter.folder,
                             hint="merge it into its own base, or pass --force-base")  # fmt: skip
        if other:
            log.warning("merging %s although it %s (--force-base)", adapter.spec.ref, other)
    if ck is not None:
        ck = merged(ck, plan_merge(ck, adapters))
    return ck, [a.record() for a in adapters]


def _made_from(settings: AllSettings, model_dir: Path, is_tiny: bool) -> MadeFrom:
    """This run's inputs, as the folders it resumes must have recorded them."""
    codec = settings.audio_tokenizer
    if codec is None:
        codec = "builtin" if is_tiny else default_codec(builtin=False, sampling_rate=None)
    if settings.audio_tokenizer_revision:
        codec = f"{codec}@{settings.audio_tokenizer_revision}"
    return MadeFrom(
        source=source_identity(settings.model, model_dir),
        outtype=settings.outtype,
        imatrix=file_sha256(settings.imatrix),
        codec=str(codec),
        synth=dict(settings.synth),
    )


def _resume_work(work: Path, made_from: MadeFrom) -> None:
    """A work folder a run left is resumed only by a run of the same inputs."""
    if work.exists() and any(work.iterdir()):
        refuse_other(work, read_record(work / RECORD_NAME), made_from, WORK_KEYS)


def locate_model(model: str, revision: str | None, cache_dir: Path | None) -> None:
    """The model is where the user said, before anything else is looked up (the codec too):
    a folder that exists, a well-formed repo id, in the cache when offline."""
    if model.startswith("builtin:"):
        return
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(
                "expected a model folder or repo id, got a file",
                path=path,
                hint="point --model at the folder that holds it",
            )
        return
    if not is_repo_id(model):
        raise InputError(
            "model folder not found",
            path=model,
            hint="give an existing folder, a Hub repo id like OpenMOSS-Team/MOSS-TTS,"
            " or builtin:tiny",
        )
    locate_repo(model, revision, cache_dir)


def _check_settings(settings: AllSettings) -> list[str]:
    """What a run refuses before it looks at anything; the canonical file type names."""
    file_types = [parse_file_type(q) for q in settings.file_types] or ["Q4_K_M"]
    if settings.outtype not in ("auto", "f16", "bf16"):
        raise UsageError(f"unknown --outtype {settings.outtype!r}", hint="use auto, f16 or bf16")
    parse_engine(settings.engine)
    if settings.imatrix is not None and not Path(settings.imatrix).is_file():
        raise InputError("importance matrix file not found", path=settings.imatrix)
    if settings.merge_lora and settings.keep_intermediate:
        raise UsageError("--merge-lora with --keep-intermediate: the extracted backbone's "
                         "shards are the source's bytes and cannot hold the merged update",
                         hint="drop --keep-intermediate (the GGUFs hold the merged "
                         "weights)")  # fmt: skip
    return file_types


def _preflight_tools(settings: AllSettings) -> None:
    """doctor's pre-flight before any download: an engine, and a llama.cpp that runs here
    (its probe is cached per installed build); the disk follows with the plan's count."""
    preflight(
        needs_quantize=True,
        needs_runtime=True,
        output=None,
        needed_bytes=None,
        llama_cpp=settings.llama_cpp,
        engine=settings.engine,
        from_checkpoint=True,
    )


def _open_local(settings: AllSettings, is_tiny: bool) -> MossCheckpoint | None:
    """A local model folder, opened (the run's checkpoint) before anything else is looked at:
    refusing a look-alike model needs no codec. None for a Hub or builtin model."""
    if not is_tiny and Path(settings.model).expanduser().is_dir():
        return open_checkpoint(Path(settings.model).expanduser())
    return None


def _find_codec(
    settings: AllSettings, is_tiny: bool, bar: ProgressReporter
) -> AudioTokenizer | None:
    """The codec before the model: a missing one fails in seconds, not after the conversion."""
    return resolve_codec(
        settings.audio_tokenizer, builtin=is_tiny,
        revision=settings.audio_tokenizer_revision, cache_dir=settings.cache_dir,
        progress=bar,
    )  # fmt: skip


def _refuse_other_output(output: Path, what: str) -> None:
    """An output that is there and not empty is someone's: never replaced without --force."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise OutputError(
            f"output exists and is not a finished `all` run of {what}",
            path=output,
            hint="choose another --output or pass --force to replace it",
        )


def _preflight_disk(
    checkpoint: MossCheckpoint, settings: AllSettings, output: Path, direct: bool
) -> None:
    """The disk of the output's folder holds the whole plan (before anything is written)."""
    needed = plan_bytes(checkpoint, settings, direct)
    preflight(
        needs_quantize=False,
        output=output,
        needed_bytes=needed,
        llama_cpp=settings.llama_cpp,
        engine=settings.engine,
        from_checkpoint=True,
    )
    log.info("the plan needs about %s of free disk", human_bytes(needed))


# --------------------------------------------------------------------------- the steps


def _run_steps(ctx: RunContext) -> None:
    """The five steps in order, each skipped when its output is complete. Extract runs in the
    background beside convert and quantize, the steps that decide the wall time."""
    extract = ExtractStep()
    ctx.bar.start("steps", "all", len(STEPS), "")
    ctx.find_earlier_outputs()
    # which steps read the source: each drops what it has read once the other is past it
    ctx.pages = plan_page_drops(ctx, extracting=extract.plan(ctx) is None)
    extracting = extract.start(ctx)
    try:
        ctx.run(ConvertStep())
        ctx.run(QuantizeStep())
    finally:
        if extracting is not None:
            # convert or quantize stopped early: let the background extract end first
            extracting.wait_quietly()
    if extracting is not None:
        extracting.finish()  # extract's own error, if any, is raised here
    dropping = _drop_intermediate(ctx)
    try:
        ctx.run(LayoutStep())
        ctx.run(VerifyStep())
    finally:
        if dropping is not None:  # ended before a failed verify removes the work folder
            dropping.join()
    ctx.bar.finish("steps")


def _drop_intermediate(ctx: RunContext) -> threading.Thread | None:
    """The intermediate GGUF has served: free its disk and page cache on the other core while
    layout and verify run (a rerun after this point finds the quantized GGUFs complete)."""
    if ctx.intermediate is None or ctx.settings.keep_intermediate:
        return None
    dropping = threading.Thread(target=ctx.intermediate.unlink, kwargs={"missing_ok": True})
    dropping.start()
    return dropping


# --------------------------------------------------------------------------- after the steps


def _finish(ctx: RunContext) -> AllResult:
    """The work folder removed, or kept beside the output (--keep-intermediate); the result."""
    kept = None
    if ctx.work.exists():
        if ctx.settings.keep_intermediate:
            kept = ctx.output.parent / f"{ctx.output.name}-intermediate"
            shutil.rmtree(kept, ignore_errors=True)
            ctx.work.rename(kept)
        else:
            shutil.rmtree(ctx.work)
    config, files, speaks = _manifest_summary(ctx.output)
    return AllResult(
        ctx.output, config, [ctx.output / g.name for g in ctx.ggufs], ctx.steps, files, kept,
        ctx.notes, ctx.report, speaks=speaks,
    )  # fmt: skip


def _manifest_summary(output: Path) -> tuple[Path, list[tuple[str, int]], bool]:
    """A finished folder's synth config, files (path, size) and whether it has a codec."""
    manifest = json.loads((output / MANIFEST_NAME).read_text())
    config = output / manifest.get("config", CONFIG_NAME)
    files = [(f["path"], f["size"]) for f in manifest["files"]]
    return config, files, manifest.get("audio_tokenizer", "?") is not None


# --------------------------------------------------------------------------- pre-converted


def run_preconverted(
    settings: AllSettings, repo: GgufRepo, progress: ProgressReporter | None = None
) -> AllResult:
    """`all` on pre-converted weights: fetch and check them, lay them out, verify."""
    bar = ensure(progress)
    output = Path(settings.output)
    steps: list[StepResult] = []
    record = HashRecord()  # the Hub's digests, then layout's: verify reads nothing twice
    paths = choose(repo, settings.file_types)
    names = [Path(p).name for p in paths]
    made_from = _preconverted_made_from(settings, repo, paths)
    finished = not settings.force and _layout_complete(output, names)
    if finished:
        refuse_other(output, manifest_made_from(output), made_from)
        steps += [StepResult("download", "skipped"), StepResult("layout", "skipped")]
    else:
        if not settings.force:
            _refuse_other_output(output, "these weights")
        t = time.perf_counter()
        own = repo.codec and settings.audio_tokenizer is None  # a pushed folder's own codec
        codec = None if own else resolve_codec(
            settings.audio_tokenizer, builtin=False, revision=settings.audio_tokenizer_revision,
            cache_dir=settings.cache_dir, progress=bar,
        )  # fmt: skip
        root, digests, checked = fetch(repo, paths, settings.revision, settings.cache_dir, bar)
        if own:  # checked with the rest by fetch, against the listing and the manifest
            codec = resolve_codec(str(root / AUDIO_TOKENIZER_DIR), builtin=False, progress=bar)
        for rel, digest in digests.items():
            record.remember_sha256((root / rel).resolve(), digest)  # layout's manifest reuses
        detail = f"{len(digests)} files, {checked}" if digests else checked
        steps.append(StepResult("download", "done", time.perf_counter() - t, detail))
        t = time.perf_counter()
        entries = _arrange_preconverted(
            settings, repo, paths, names, root, codec, bar, record, made_from, checked
        )
        took = time.perf_counter() - t
        steps.append(StepResult("layout", "done", took, f"{entries} files"))
    t = time.perf_counter()
    with removed_if_verify_fails(Written(output, ours=not finished)):
        report, detail = verify_folder(output, bar, record)
    steps.append(StepResult("verify", "done", time.perf_counter() - t, detail))
    config, files, speaks = _manifest_summary(output)
    return AllResult(
        output, config, [output / n for n in names], steps, files, None, [], report, speaks=speaks
    )


def _preconverted_made_from(settings: AllSettings, repo: GgufRepo, paths: list[str]) -> MadeFrom:
    """A pre-converted source: the repo at its commit, or the folder and its files' sizes."""
    if repo.local is not None:
        source = folder_identity(repo.local, sorted(paths + repo.tables + repo.tokenizer))
    else:
        commit = repo.listing.commit if repo.listing is not None else None
        source = {"repo": repo.source, "commit": commit or settings.revision or "main"}
    codec = settings.audio_tokenizer or default_codec(builtin=False, sampling_rate=None)
    if repo.codec and settings.audio_tokenizer is None:
        codec = f"{repo.source}/{AUDIO_TOKENIZER_DIR}"  # the pushed folder's own
    if settings.audio_tokenizer_revision:
        codec = f"{codec}@{settings.audio_tokenizer_revision}"
    return MadeFrom(source=source, outtype="as published", codec=str(codec),
                    synth=dict(settings.synth))  # fmt: skip


def _arrange_preconverted(
    settings: AllSettings,
    repo: GgufRepo,
    paths: list[str],
    names: list[str],
    root: Path,
    codec: AudioTokenizer | None,
    bar: ProgressReporter,
    record: HashRecord,
    made_from: MadeFrom,
    checked: str,
) -> int:
    """Lay the fetched files out (their meta derived from the GGUF); the number of entries."""
    output = Path(settings.output)
    meta = derive_meta(root, repo, paths[0])
    output.parent.mkdir(parents=True, exist_ok=True)
    meta_path = write_meta(meta, output.parent)
    try:
        items = [Placement(root / p, Path(p).name, movable=False) for p in paths]
        items += [Placement(root / p, p, movable=False) for p in repo.tables + repo.tokenizer]
        items.append(Placement(meta_path, META_NAME, movable=False))
        if codec is not None:
            items += audio_tokenizer_files(codec)
        r = arrange(
            items, meta, names, output, codec=codec, source_model=repo.source,
            synth_overrides=settings.synth or None, made_from=made_from, source_check=checked,
            force=settings.force, progress=bar, record=record,
        )  # fmt: skip
    finally:
        shutil.rmtree(meta_path.parent, ignore_errors=True)
    return len(r.entries)


# --------------------------------------------------------------------------- first-class


def run_from_first_class(
    settings: AllSettings, fc: FirstClassInput, progress: ProgressReporter | None = None
) -> AllResult:
    """`all` on a first-class moss-tts-delay GGUF: checked, taken apart (from_first_class.py),
    laid out as the backend layout, verified."""
    bar = ensure(progress)
    output = Path(settings.output)
    record = HashRecord()
    asked = settings.audio_tokenizer
    beside = fc.gguf.parent / AUDIO_TOKENIZER_DIR
    if asked is None and beside.is_dir():
        asked = str(beside)  # the codec `all --format moss-tts-delay` put beside the GGUF
    codec_asked = asked or default_codec(builtin=False, sampling_rate=None)
    if settings.audio_tokenizer_revision:
        codec_asked = f"{codec_asked}@{settings.audio_tokenizer_revision}"
    made_from = MadeFrom(source=fc.source, outtype="as published", codec=str(codec_asked),
                         synth=dict(settings.synth))  # fmt: skip
    steps: list[StepResult] = []
    if not settings.force:
        _refuse_other_output(output, "this first-class GGUF")
    codec = resolve_codec(
        asked, builtin=False, revision=settings.audio_tokenizer_revision,
        cache_dir=settings.cache_dir, progress=bar,
    )  # fmt: skip
    t = time.perf_counter()
    unpacked = unpack(fc, output, bar)
    try:
        steps.append(StepResult("extract", "done", time.perf_counter() - t,
                                f"{fc.gguf.name}: tables {unpacked.meta['first_class']['tables']}"))
        t = time.perf_counter()
        items = unpacked.items + (audio_tokenizer_files(codec) if codec is not None else [])
        r = arrange(
            items, unpacked.meta, unpacked.names, output, codec=codec, source_model=fc.model,
            synth_overrides=settings.synth or None, made_from=made_from, source_check=fc.checked,
            force=settings.force, progress=bar, record=record,
        )  # fmt: skip
        took = time.perf_counter() - t
        steps.append(StepResult("layout", "done", took, f"{len(r.entries)} files"))
    finally:
        shutil.rmtree(unpacked.work, ignore_errors=True)
    t = time.perf_counter()
    with removed_if_verify_fails(Written(output)):  # laid out by this run, always
        report, detail = verify_folder(output, bar, record)
    steps.append(StepResult("verify", "done", time.perf_counter() - t, detail))
    config, files, speaks = _manifest_summary(output)
    ggufs = [output / n for n in unpacked.names]
    return AllResult(output, config, ggufs, steps, files, None, [], report, speaks=speaks)
