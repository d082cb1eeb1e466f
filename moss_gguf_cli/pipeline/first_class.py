"""Writing the first-class `moss-tts-delay` format: `convert --format` and `all --format`.

A first-class folder holds the GGUF(s) of gguf/first_class.py, the tokenizer, the ONNX audio
tokenizer, `manifest.json` and a README.md with the commands that run it with OpenMOSS's
llama.cpp fork. Quantized files come from the direct engine (quantize/direct.py): one read of
the checkpoint for every type, and the f16/bf16 file itself when it is asked for too.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from ..disk.digests import HashRecord
from ..disk.layout_names import MANIFEST_NAME, TOKENIZER_DIR
from ..disk.page_cache import SourcePages
from ..disk.staging import Staging, check_free_space, staged_file
from ..errors import UsageError
from ..gguf.file_types import parse_file_type
from ..gguf.first_class import FILE_STEM, FORMAT, parse_audio_tables_type
from ..gguf.first_class_read import check_first_class
from ..gguf.write import OutType, write_gguf
from ..progress import ProgressReporter, ensure
from ..quantize.llama import QuantizeSettings
from ..source.audio_tokenizer import AudioTokenizer
from ..source.audio_tokenizer import default_source as default_codec
from ..source.audio_tokenizer import resolve as resolve_codec
from ..source.checkpoint import TOKENIZER_FILES, open_checkpoint, resolve_model
from ..source.first_class import plan_first_class
from .audio_codec import (
    MANIFEST_KEY,
    NativeCodec,
    native_manifest,
    native_readme,
    prepare_native,
    write_native,
)
from .layout import audio_tokenizer_files, gguf_file_type
from .made_from import MadeFrom, manifest_made_from, refuse_other, source_identity

log = logging.getLogger(__name__)

BACKEND = "backend"
FORMATS = (BACKEND, FORMAT)
README_NAME = "README.md"
# the fork the format is read by, and the commit its byte identity was checked against
FORK = "https://github.com/expectqwq/llama.cpp"
FORK_COMMIT = "7d26f9138947778ff471e278eb5a148c70777633"
FLOAT_TYPES = ("F16", "BF16")


def parse_formats(values: list[str] | None) -> list[str]:
    """--format values, checked and without repeats; default: the backend layout alone."""
    out: list[str] = []
    for value in values or [BACKEND]:
        v = value.strip().lower()
        if v not in FORMATS:
            raise UsageError(f"unknown format {value!r}", hint="choose " + " or ".join(FORMATS))
        if v not in out:
            out.append(v)
    return out


@dataclass
class FirstClassConverted:
    outfile: Path
    outtype: str
    n_tensors: int
    tensor_types: dict[str, int]
    bytes_written: int
    seconds: float


def convert_first_class(
    model: Path,
    outfile: Path,
    outtype: str | OutType = "f16",
    force: bool = False,
    progress: ProgressReporter | None = None,
    pages: SourcePages | None = None,
) -> FirstClassConverted:
    """The checkpoint as one moss-tts-delay GGUF in f16/bf16/f32/q8_0, as the fork's
    convert_hf_to_gguf.py writes it."""
    started = time.perf_counter()
    plan = plan_first_class(Path(model), outtype)
    with staged_file(Path(outfile), force=force) as tmp:
        check_free_space(tmp.parent, plan.tensor_bytes + (64 << 20), Path(outfile))
        size = write_gguf(tmp, plan, progress, pages)
    types = dict(Counter(t.qtype.name for t in plan.tensors))
    return FirstClassConverted(
        Path(outfile), plan.outtype.value, len(plan.tensors), types, size,
        time.perf_counter() - started,
    )  # fmt: skip


def gguf_names(file_types: list[str]) -> list[str]:
    """The folder's GGUF file names, one per requested type (F16/BF16: the unquantized file)."""
    return [f"{FILE_STEM}_{q.lower()}.gguf" for q in file_types]


@dataclass
class FirstClassFolder:
    output: Path
    ggufs: list[Path]
    files: list[tuple[str, int]]
    seconds: float
    notes: list[str] = field(default_factory=list)


def write_first_class(
    model: Path,
    output: Path,
    file_types: list[str],
    outtype: str,
    codec: AudioTokenizer | None,
    source_model: str,
    threads: int | None = None,
    force: bool = False,
    progress: ProgressReporter | None = None,
    audio_tables: str | None = None,
    made_from: MadeFrom | None = None,
    handoff: Path | None = None,
    native: NativeCodec | None = None,
) -> FirstClassFolder:
    """A first-class folder at output: every type in one read of the checkpoint (or taken
    from HANDOFF, where the backend run's pass wrote them all), then the tokenizer, the codec,
    README.md and manifest.json; renamed into place when complete."""
    started = time.perf_counter()
    bar = ensure(progress)
    notes: list[str] = []
    floats = [q for q in file_types if q in FLOAT_TYPES]
    if len(floats) > 1:
        raise UsageError("F16 and BF16 both asked for", hint="keep one of them")
    if floats:
        outtype = floats[0].lower()  # the unquantized file is the intermediate itself
    with Staging(Path(output), force=force) as stage:
        if not _take_handoff(handoff, stage.path, gguf_names(file_types)):
            notes = _write_ggufs(model, stage.path, file_types, outtype, threads, bar, audio_tables)
        ck_tokenizer = [Path(model) / n for n in TOKENIZER_FILES if (Path(model) / n).is_file()]
        (stage.path / TOKENIZER_DIR).mkdir()
        for src in ck_tokenizer:
            shutil.copyfile(src, stage.path / TOKENIZER_DIR / src.name)
        if codec is not None:
            for item in audio_tokenizer_files(codec):
                _link_or_copy(item.source, stage.path / item.rel)
        if native is not None:
            write_native(native, stage.path, bar)
        names = gguf_names(file_types)
        text = readme(names, codec is not None)
        text += native_readme(names[0], native.names) if native is not None else ""
        (stage.path / README_NAME).write_text(text)  # the model card replaces it after checks
        tables = audio_tables.strip().lower() if audio_tables else None
        files = _manifest(stage.path, names, codec, source_model, tables, made_from, native)
        stage.commit()
    return FirstClassFolder(
        Path(output), [Path(output) / n for n in names], files,
        time.perf_counter() - started, notes,
    )  # fmt: skip


def _write_ggufs(
    model: Path, folder: Path, file_types: list[str], outtype: str, threads, bar, audio_tables
) -> list[str]:
    """Every requested type into folder: the quantized ones from one read by the direct
    engine, which also writes the f16/bf16 file when that is asked for."""
    quantized = [(folder / n, q) for n, q in zip(gguf_names(file_types), file_types, strict=True)
                 if q not in FLOAT_TYPES]  # fmt: skip
    wants_float = len(quantized) < len(file_types)
    if not quantized:
        kind = outtype if outtype != "auto" else "f16"
        convert_first_class(model, folder / f"{FILE_STEM}_{kind}.gguf", kind, True, bar)
        return []
    # lazy: quantize.direct loads ml_dtypes (half a second): only a run that quantizes pays it
    from ..quantize.direct import quantize_checkpoint

    done = quantize_checkpoint(
        Path(model), quantized, outtype, QuantizeSettings(threads=threads), None, folder,
        keep_intermediate=wants_float, force=True, progress=bar, first_class=True,
        audio_tables=audio_tables,
    )  # fmt: skip
    return done.notes


def _take_handoff(handoff: Path | None, folder: Path, names: list[str]) -> bool:
    """Move the GGUFs the backend run's pass wrote (all of them, or none is taken)."""
    if handoff is None or not all((handoff / n).is_file() for n in names):
        return False
    for n in names:
        os.replace(handoff / n, folder / n)
    return True


def _link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src.resolve(), dest)
    except OSError:
        shutil.copyfile(src.resolve(), dest)


def _manifest(
    folder: Path,
    names: list[str],
    codec: AudioTokenizer | None,
    source_model: str,
    audio_tables: str | None,
    made_from: MadeFrom | None = None,
    native: NativeCodec | None = None,
) -> list[tuple[str, int]]:
    """manifest.json: what the folder is, and every file's size and sha256."""
    # README.md is the model card, written after the checks: outside the files (pipeline/card.py)
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.relative_to(folder).as_posix() != README_NAME)  # fmt: skip
    hashes = HashRecord()
    entries = [
        {"path": rel, "size": (folder / rel).stat().st_size, "sha256": hashes.sha256(folder / rel)}
        for rel in rels
    ]
    manifest = {
        "tool": f"moss-gguf {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "format": FORMAT,
        "source_model": source_model,
        "quant_types": {n: gguf_file_type(folder / n) for n in names},
        "audio_tables_type": audio_tables,  # None: the quantizer's (each file's base type)
        "runtime": {"llama.cpp": FORK, "commit": FORK_COMMIT, "binary": "llama-moss-tts"},
        "audio_tokenizer": codec.source if codec is not None else None,
        MANIFEST_KEY: native_manifest(native) if native is not None else None,
        "made_from": made_from.to_json() if made_from is not None else None,
        "card": README_NAME,  # outside "files": it reports the checks of the files
        "files": entries,
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return [(e["path"], e["size"]) for e in entries]


def readme(names: list[str], has_codec: bool) -> str:
    """The folder's README.md: what it is and the fork's commands that run it."""
    model = names[0]
    codec = (
        "--onnx-encoder audio_tokenizer/encoder.onnx --onnx-decoder audio_tokenizer/decoder.onnx"
        if has_codec else "--onnx-encoder ENCODER.onnx --onnx-decoder DECODER.onnx"
    )  # fmt: skip
    files = "\n".join(f"- `{n}`" for n in names)
    return f"""# MOSS-TTS, first-class llama.cpp GGUF (`{FORMAT}`)

Written by moss-gguf. One GGUF of architecture `{FORMAT}` holds the Qwen3 backbone, the text
embedding, the audio embeddings, the text head and the audio heads. It runs with OpenMOSS's
llama.cpp fork ({FORK}, checked at commit `{FORK_COMMIT[:12]}`), not with the stock llama.cpp,
and it is not the file of OpenMOSS-Team/MOSS-TTS-GGUF.

{files}
- `tokenizer/`: the text tokenizer (`tokenizer.json`)
- `audio_tokenizer/`: the ONNX audio tokenizer (encoder and decoder), when included
- `manifest.json`: every file's size and sha256

## Run it

Build the fork's tools:

    cmake -S llama.cpp -B build -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-moss-tts -j

Check that it loads:

    build/bin/llama-moss-tts -m {model} --print-delay-config

Speak (the fork's end-to-end script; it needs a MOSS-TTS checkout for the prompt builder):

    python llama.cpp/tools/tts/moss-tts-firstclass-e2e.py --model-gguf {model} \\
        --moss-tts-dir /path/to/MOSS-TTS --tokenizer-dir tokenizer \\
        {codec} \\
        --text "Hello, world!" --output-wav hello.wav
"""


def folder_readme(folder: Path) -> str:
    """The README body of a finished first-class folder, rebuilt from its manifest."""
    manifest = read_manifest(folder) or {}
    names = list(manifest.get("quant_types") or {})
    text = readme(names, manifest.get("audio_tokenizer") is not None)
    native = manifest.get(MANIFEST_KEY)
    if native:
        text += native_readme(names[0], (native["encoder"], native["decoder"]))
    return text


def read_manifest(folder: Path) -> dict | None:
    """A first-class folder's manifest, or None when the folder is not one."""
    path = Path(folder) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None



def run_first_class(
    settings,
    progress: ProgressReporter | None = None,
    audio_tables: str | None = None,
    handoff: Path | None = None,
) -> FirstClassFolder:
    """`all --format moss-tts-delay`: the codec and the model found, the folder written (or
    found complete: a rerun only checks it), every GGUF in it checked. ``audio_tables``:
    --audio-tables-type (f16, bf16 or q8_0 tables in the quantized files); ``handoff``: a
    folder that may hold the GGUFs already (pipeline/dual.py)."""
    bar = ensure(progress)
    output = Path(settings.output)
    file_types = [parse_file_type(q) for q in settings.file_types] or ["Q4_K_M"]
    check_first_class_settings(settings)
    parse_audio_tables_type(audio_tables)  # a bad value fails before any work
    started = time.perf_counter()
    names = gguf_names(file_types)
    model = resolve_model(settings.model, settings.revision, settings.cache_dir, bar)
    made_from = first_class_made_from(settings, model)
    native_spec = settings.native_codec
    if not settings.force and folder_complete(output, names, audio_tables, native_spec):
        # a folder made from other inputs is refused, as the backend layout refuses it
        refuse_other(output, manifest_made_from(output), made_from)
        files = [(f["path"], f["size"]) for f in read_manifest(output)["files"]]
        folder = FirstClassFolder(output, [output / n for n in names], files, 0.0)
        folder.notes.append("already complete: checked, not written again")
    else:
        is_tiny = settings.model.startswith("builtin:")
        moss = open_checkpoint(model).moss  # refuses a look-alike before the codec is fetched
        codec = resolve_codec(
            settings.audio_tokenizer, builtin=is_tiny, sampling_rate=moss.sampling_rate,
            revision=settings.audio_tokenizer_revision, cache_dir=settings.cache_dir,
            progress=bar,
        )  # fmt: skip
        native = None
        if native_spec is not None:  # checked before the long work
            native = prepare_native(native_spec, cache_dir=settings.cache_dir, progress=bar)
        folder = write_first_class(
            model, output, file_types, settings.outtype, codec, settings.model,
            threads=settings.threads, force=settings.force, progress=bar,
            audio_tables=audio_tables, made_from=made_from, handoff=handoff, native=native,
        )  # fmt: skip
    for path in folder.ggufs:
        check_first_class(path)
    folder.seconds = time.perf_counter() - started
    return folder


def first_class_made_from(settings, model: Path) -> MadeFrom:
    """What the folder is made from, as the backend folder records it; its format (the audio
    tables' type is the manifest's audio_tables_type)."""
    codec = settings.audio_tokenizer or ("builtin" if settings.model.startswith("builtin:")
                                         else default_codec(builtin=False, sampling_rate=None))
    if settings.audio_tokenizer_revision:
        codec = f"{codec}@{settings.audio_tokenizer_revision}"
    return MadeFrom(source=source_identity(settings.model, model), outtype=settings.outtype,
                    codec=str(codec), format=FORMAT)  # fmt: skip


def check_first_class_settings(settings) -> None:
    if settings.outtype not in ("auto", "f16", "bf16"):
        raise UsageError(f"unknown --outtype {settings.outtype!r}", hint="use auto, f16 or bf16")
    if settings.engine not in ("auto", "direct"):
        raise UsageError(
            f"--engine {settings.engine} cannot write the {FORMAT} format",
            hint="the stock llama.cpp does not know the architecture; leave --engine at auto "
            "(the direct engine, which asks llama.cpp about a qwen3 stand-in)",
        )
    if settings.imatrix is not None:
        raise UsageError(
            f"--imatrix is not supported with --format {FORMAT} yet",
            hint="quantize without it, or use the backend format",
        )


def folder_complete(
    output: Path, names: list[str], audio_tables: str | None, native: str | None = None
) -> bool:
    """A finished first-class folder of exactly these GGUFs (sizes as its manifest says),
    with the codec GGUFs of NATIVE (None: without)."""
    manifest = read_manifest(output)
    if manifest is None or sorted(manifest.get("quant_types") or {}) != sorted(names):
        return False
    if (manifest.get(MANIFEST_KEY) or {}).get("source") != native:
        return False
    wanted = audio_tables.strip().lower() if audio_tables else None
    if manifest.get("audio_tables_type") != wanted:
        return False
    try:
        return all((output / f["path"]).stat().st_size == f["size"] for f in manifest["files"])
    except (OSError, KeyError, TypeError):
        return False
