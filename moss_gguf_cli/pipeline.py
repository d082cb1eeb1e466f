"""`all`: extract → convert → quantize → layout → verify, as one resumable run.

Work happens in a hidden folder beside the output (``.NAME.work``). Each step
writes atomically, so a step's output either exists complete or not at all; a
rerun skips every step whose output exists and passes a quick check, and redoes
the rest. The backbone is converted straight from the source shards, so no
intermediate safetensors copy is written unless asked for.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .audio_tokenizer import default_source as default_codec
from .audio_tokenizer import resolve as resolve_codec
from .checkpoint import open_checkpoint, resolve_model
from .digests import remember_sha256
from .errors import MossGgufError, NumericError, OutputError, UsageError
from .extract import EMBEDDING_DIR, LM_HEAD_DIR, META_NAME, extract, npy_jobs
from .holds import hold
from .layout import (
    MANIFEST_NAME,
    LayoutMode,
    Placement,
    arrange,
    audio_tokenizer_files,
    expected_tables,
    layout,
    read_meta,
)
from .preconverted import GgufRepo, choose, derive_meta, fetch, recognise, write_meta
from .progress import ProgressReporter, ensure
from .quantize import APPROX_BPW
from .source_pages import SourcePages
from .staging import human_bytes, remove_stale_partials

log = logging.getLogger(__name__)

STEPS = ("extract", "convert", "quantize", "layout", "verify")
# the tiny demo model never learnt to stop: keep its synth runs short
# the random tiny model: short runs, every core (its steps are too small for a fixed pool)
_DEMO_SYNTH = {"max_new_tokens": 120, "n_threads": 0}


@dataclass
class AllSettings:
    model: str
    output: Path
    quants: list[str] = field(default_factory=lambda: ["Q4_K_M"])
    outtype: str = "auto"  # f16, bf16, or auto: f16 unless a tensor overflows it
    engine: str = "auto"  # quantize engine
    llama_cpp: Path | None = None
    keep_intermediate: bool = False
    force: bool = False
    revision: str | None = None
    cache_dir: Path | None = None
    audio_tokenizer: str | Path | None = None  # None: the model's own; "none": no codec
    audio_tokenizer_revision: str | None = None
    threads: int | None = None
    synth: dict[str, Any] = field(default_factory=dict)  # moss-tts.yaml keys to override


@dataclass
class StepResult:
    name: str
    status: str  # "done" or "skipped"
    seconds: float = 0.0
    detail: str = ""


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


def plan_bytes(model_dir: Path, settings: AllSettings) -> int:
    """Peak disk the run needs: tables + intermediate GGUF + quantized GGUFs (+ kept copy)."""
    ck = open_checkpoint(model_dir)
    backbone_params = sum(int(np.prod(r.shape)) for _, r in ck.backbone_tensors())
    tables = sum(int(np.prod(j.source.shape)) * 2 for j in npy_jobs(ck))
    intermediate = backbone_params * 2
    quantized = sum(backbone_params * APPROX_BPW.get(q.upper(), 16) / 8 for q in settings.quants)
    kept = sum(r.nbytes for _, r in ck.backbone_tensors()) if settings.keep_intermediate else 0
    return int(tables + intermediate + quantized + kept) + (64 << 20)


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
    return (folder / "qwen3_backbone" / "tokenizer.json").is_file()


def _gguf_complete(path: Path, file_type: str | None = None) -> bool:
    from .quantize import inspect_gguf

    if not path.is_file():
        return False
    try:
        info = inspect_gguf(path)
    except MossGgufError:
        return False
    if info.size < info.data_end:
        return False
    if file_type is not None:
        from .quantize import file_types

        return info.file_type == file_types().get(file_type)
    return True


def _layout_complete(output: Path, gguf_names: list[str]) -> bool:
    """A finished weights folder of exactly these GGUFs (sizes as its manifest says)."""
    import json

    manifest = output / MANIFEST_NAME
    if not manifest.is_file():
        return False
    try:
        data = json.loads(manifest.read_text())
        if sorted(data["quant_types"]) != sorted(gguf_names):
            return False
        return all((output / f["path"]).stat().st_size == f["size"] for f in data["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def run_all(
    settings: AllSettings,
    progress: ProgressReporter | None = None,
    on_step: Callable[[str, int], None] | None = None,
) -> AllResult:
    """Run every step that is not already complete; return what was made and how long it took."""
    from .convert import convert
    from .doctor import preflight
    from .quantize import output_name, parse_engine, parse_file_type, resolve_engine

    bar = ensure(progress)
    if not settings.model.startswith("builtin:"):
        repo = recognise(settings.model, settings.revision, settings.cache_dir)
        if repo is not None:
            return run_preconverted(settings, repo, bar)
    output = Path(settings.output)
    quants = [parse_file_type(q) for q in settings.quants] or ["Q4_K_M"]
    if settings.outtype not in ("auto", "f16", "bf16"):
        raise UsageError(f"unknown --outtype {settings.outtype!r}", hint="use auto, f16 or bf16")
    work = work_dir(output)
    if settings.force:
        shutil.rmtree(work, ignore_errors=True)
    is_tiny = settings.model.startswith("builtin:")
    extracted = work / "extracted"
    ggufs = [work / output_name(Path("backbone_f16.gguf"), q) for q in quants]
    names = [g.name for g in ggufs]

    # up front: where the model is, which engine quantizes, and whether the disk holds it all
    layout_done = not settings.force and _layout_complete(output, names)
    if not layout_done:
        # doctor's pre-flight before any download: an engine, and a llama.cpp that runs here
        # (its probe is cached per installed build); the disk follows with the plan's count
        preflight(
            needs_quantize=True,
            needs_runtime=True,
            output=None,
            needed_bytes=None,
            llama_cpp=settings.llama_cpp,
            engine=settings.engine,
        )
    # the codec before the model: a missing one fails in seconds, not after the conversion.
    # A local folder is looked at first: refusing a look-alike model needs no codec.
    if not layout_done and not is_tiny and Path(settings.model).expanduser().is_dir():
        open_checkpoint(Path(settings.model).expanduser())
    codec = None
    if not layout_done:
        codec = resolve_codec(
            settings.audio_tokenizer, builtin=is_tiny,
            revision=settings.audio_tokenizer_revision, cache_dir=settings.cache_dir,
            progress=bar,
        )  # fmt: skip
    model_dir = resolve_model(settings.model, settings.revision, settings.cache_dir, bar)
    if codec is not None and settings.audio_tokenizer is None:
        default_codec(builtin=is_tiny, sampling_rate=open_checkpoint(model_dir).moss.sampling_rate)
    engine, _ = resolve_engine(parse_engine(settings.engine), settings.llama_cpp)
    if (
        not layout_done
        and not settings.force
        and output.exists()
        and (not output.is_dir() or any(output.iterdir()))
    ):
        raise OutputError(
            "output exists and is not a finished `all` run of these quant types",
            path=output,
            hint="choose another --output or pass --force to replace it",
        )
    if not layout_done and not work.exists():
        needed = plan_bytes(model_dir, settings)
        preflight(
            needs_quantize=False,
            output=output,
            needed_bytes=needed,
            llama_cpp=settings.llama_cpp,
            engine=settings.engine,
        )
        log.info("the plan needs about %s of free disk", human_bytes(needed))
    if not layout_done:
        work.mkdir(parents=True, exist_ok=True)

    steps: list[StepResult] = []
    notes: list[str] = []
    bar.start("steps", "all", len(STEPS), "")

    def step(name: str) -> float:
        if on_step:
            on_step(name, STEPS.index(name))
        bar.advance("steps", 0, description=f"{name} ({STEPS.index(name) + 1}/{len(STEPS)})")
        return time.perf_counter()

    def done(name: str, started: float, detail: str = "") -> None:
        steps.append(StepResult(name, "done", time.perf_counter() - started, detail))
        bar.advance("steps", 1)

    def skipped(name: str, detail: str = "already complete") -> None:
        steps.append(StepResult(name, "skipped", 0.0, detail))
        bar.advance("steps", 1)

    # which steps read the source: each drops what it has read once the other is past it
    wanted = ("f16", "bf16") if settings.outtype == "auto" else (settings.outtype,)
    intermediate = next(
        (
            work / f"backbone_{t}.gguf"
            for t in wanted
            if _gguf_complete(work / f"backbone_{t}.gguf")
        ),
        None,
    )
    quantized = all(_gguf_complete(g, q) for g, q in zip(ggufs, quants, strict=True))
    must_extract = not layout_done and not _extract_complete(extracted)
    must_convert = not (layout_done or quantized or intermediate is not None)
    pages = None
    if (must_extract or must_convert) and not settings.keep_intermediate:
        pages = _source_pages(model_dir, must_extract, must_convert)

    # 1. extract: tables, tokenizer and meta (the backbone weights only if kept). It runs in
    #    the background at the lowest CPU priority, so that convert and quantize, which
    #    decide the wall time, keep the cores and extract takes what they leave idle; it
    #    hashes its tables as it writes them so that layout's manifest need not read them.
    extracting = None
    if not must_extract:
        skipped("extract")
    else:
        t_extract = step("extract")
        remove_stale_partials(extracted)

        def extract_and_hash():
            _yield_cpu()
            r = extract(
                model_dir,
                extracted,
                force=True,
                source_model=settings.model,
                backbone_weights=settings.keep_intermediate,
                remember=True,
                source_pages=pages,
                progress=bar,
            )
            return r, time.perf_counter() - t_extract

        background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="extract")
        extracting = background.submit(extract_and_hash)
        background.shutdown(wait=False)
        steps.append(StepResult("extract", "done"))  # its time is filled in when it ends

    def extract_finished() -> None:
        nonlocal extracting
        if extracting is None:
            return
        r, seconds = extracting.result()
        extracting = None
        steps[0].seconds = seconds
        steps[0].detail = f"{len(r.npy_files)} tables, {human_bytes(r.bytes_written)}"
        bar.advance("steps", 1)

    try:
        # 2. convert the backbone straight from the source shards
        if not must_convert:
            skipped("convert")
        else:
            t = step("convert")
            outtype = "f16" if settings.outtype == "auto" else settings.outtype
            try:
                r = convert(
                    model_dir,
                    work / f"backbone_{outtype}.gguf",
                    outtype=outtype,
                    force=True,
                    progress=bar,
                    source_pages=pages,
                )
            except NumericError as exc:
                if settings.outtype != "auto":
                    raise
                notes.append(f"f16 would overflow ({exc.message}); converted to bf16 instead")
                log.warning(notes[-1])
                r = convert(
                    model_dir, work / "backbone_bf16.gguf", outtype="bf16", force=True, progress=bar
                )
            intermediate = r.outfile
            done("convert", t, f"{intermediate.name}, {human_bytes(r.bytes_written)}")

        # 3. quantize to every requested type
        if layout_done:
            skipped("quantize")
        else:
            from .quantize import quantize

            todo = [(g, q) for g, q in zip(ggufs, quants, strict=True) if not _gguf_complete(g, q)]
            if not todo:
                skipped("quantize")
            else:
                t = step("quantize")
                results = quantize(
                    intermediate,
                    [g for g, _ in todo],
                    [q for _, q in todo],
                    engine=engine,
                    llama_cpp=settings.llama_cpp,
                    threads=settings.threads,
                    force=True,
                    progress=bar,
                )
                fallbacks = sum(len(r.fallbacks) for r in results)
                done(
                    "quantize",
                    t,
                    ", ".join(f"{r.output.name} {r.bpw:.2f} bpw" for r in results)
                    + (f"; {fallbacks} fallback tensor types" if fallbacks else ""),
                )

    finally:
        if extracting is not None and not extracting.done():
            # convert or quantize stopped early: let the background extract end first
            try:
                extracting.result()
            except BaseException:  # noqa: BLE001 - the first failure is the one to report
                pass
    extract_finished()
    # the intermediate GGUF has served: free its disk and page cache on the other core while
    # layout and verify run (a rerun after this point finds the quantized GGUFs complete)
    dropping = None
    if intermediate is not None and not settings.keep_intermediate:
        dropping = threading.Thread(target=intermediate.unlink, kwargs={"missing_ok": True})
        dropping.start()

    # 4. layout: hard links from the work folder (same filesystem, so no copies); the work
    #    folder (all but the intermediate GGUF) stays until the end, so a run killed here
    #    resumes at this step
    if layout_done:
        skipped("layout")
    else:
        t = step("layout")
        r = layout(
            extracted,
            ggufs,
            output,
            mode=LayoutMode.link,
            audio_tokenizer=codec,
            synth_overrides={**(_DEMO_SYNTH if is_tiny else {}), **settings.synth} or None,
            source_model=settings.model,
            force=True,
            progress=bar,
        )
        done("layout", t, f"{len(r.entries)} files")

    # 5. verify the finished folder (fast checks)
    t = step("verify")
    hold("verify")
    report, detail = _verify_step(output, bar)
    done("verify", t, detail)
    bar.finish("steps")

    if dropping is not None:
        dropping.join()
    kept = None
    if work.exists():
        if settings.keep_intermediate:
            kept = output.parent / f"{output.name}-intermediate"
            shutil.rmtree(kept, ignore_errors=True)
            work.rename(kept)
        else:
            shutil.rmtree(work)
    manifest = json.loads((output / MANIFEST_NAME).read_text())
    config = output / manifest.get("config", "moss-tts.yaml")
    files = [(f["path"], f["size"]) for f in manifest["files"]]
    speaks = manifest.get("audio_tokenizer", "?") is not None
    return AllResult(
        output, config, [output / g.name for g in ggufs], steps, files, kept, notes, report,
        speaks=speaks,
    )  # fmt: skip


def _source_pages(model_dir: Path, extracting: bool, converting: bool) -> SourcePages:
    """The source ranges extract and convert will read, each reader announced."""
    ck = open_checkpoint(model_dir)
    pages = SourcePages()
    if extracting:
        pages.expect(
            "extract", ((j.source.path, j.source.offset, j.source.nbytes) for j in npy_jobs(ck))
        )
    if converting:
        pages.expect("convert", ((r.path, r.offset, r.nbytes) for _, r in ck.backbone_tensors()))
    return pages


def _yield_cpu() -> None:
    """Lowest CPU priority for the calling thread and the threads it starts (Linux: nice is
    per thread and inherited); elsewhere a no-op."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def _verify_step(output: Path, progress: ProgressReporter):
    """verify's fast checks of the finished folder; raises on a failing row. (report, detail)"""
    from .verify import CODEC_ROW, verify  # an import error fails the step, never "done"

    report = verify(output, progress=progress)
    silent = json.loads((output / MANIFEST_NAME).read_text()).get("audio_tokenizer", "?") is None
    # a folder made without a codec fails verify's codec row by design; all else must pass
    failed = [
        row for row in report.rows
        if row.status == "fail" and not (silent and row.name == CODEC_ROW)
    ]  # fmt: skip
    if failed:
        raise MossGgufError(
            f"verify failed: {failed[0].name}: {failed[0].detail} ({len(failed)} failing checks)",
            path=output,
            hint="`moss-gguf verify` shows the full report; --force redoes all",
        )
    return report, ("all checks pass" if not silent else "all checks pass but the codec's")


def run_preconverted(
    settings: AllSettings, repo: GgufRepo, progress: ProgressReporter | None = None
) -> AllResult:
    """`all` on pre-converted weights: fetch and check them, lay them out, verify."""
    bar = ensure(progress)
    output = Path(settings.output)
    steps: list[StepResult] = []
    paths = choose(repo, settings.quants)
    names = [Path(p).name for p in paths]
    finished = not settings.force and _layout_complete(output, names)
    if (
        not finished and not settings.force and output.exists()
        and (not output.is_dir() or any(output.iterdir()))
    ):  # fmt: skip
        raise OutputError(
            "output exists and is not a finished `all` run of these weights",
            path=output,
            hint="choose another --output or pass --force to replace it",
        )
    if finished:
        steps += [StepResult("download", "skipped"), StepResult("layout", "skipped")]
    else:
        t = time.perf_counter()
        codec = resolve_codec(
            settings.audio_tokenizer, builtin=False, revision=settings.audio_tokenizer_revision,
            cache_dir=settings.cache_dir, progress=bar,
        )  # fmt: skip
        root, digests = fetch(repo, paths, settings.revision, settings.cache_dir, bar)
        for rel, digest in digests.items():
            remember_sha256((root / rel).resolve(), digest)  # layout's manifest reuses them
        detail = f"{len(digests)} files, sha256 as the Hub lists" if digests else "local copy"
        steps.append(StepResult("download", "done", time.perf_counter() - t, detail))
        t = time.perf_counter()
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
                synth_overrides=settings.synth or None, force=settings.force, progress=bar,
            )  # fmt: skip
        finally:
            shutil.rmtree(meta_path.parent, ignore_errors=True)
        took = time.perf_counter() - t
        steps.append(StepResult("layout", "done", took, f"{len(r.entries)} files"))
    t = time.perf_counter()
    report, detail = _verify_step(output, bar)
    steps.append(StepResult("verify", "done", time.perf_counter() - t, detail))
    manifest = json.loads((output / MANIFEST_NAME).read_text())
    config = output / manifest.get("config", "moss-tts.yaml")
    files = [(f["path"], f["size"]) for f in manifest["files"]]
    return AllResult(
        output, config, [output / n for n in names], steps, files, None, [], report,
        speaks=manifest.get("audio_tokenizer", "?") is not None,
    )  # fmt: skip
