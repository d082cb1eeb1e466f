"""Write the Realtime folder (realtime/layout.py) from an opened checkpoint, staged: it appears
under OUTPUT only when every file is written and hashed; a failure leaves nothing behind.

The backbone is written once by the native Qwen3 writer at the checkpoint's own precision
(BF16 for the release: exact; F32 for anything wider) and quantized from it by llama.cpp to
each other requested type; F32 is written directly. The depth GGUF is written per type, one
tensor at a time, by ggml's quantizer (realtime/depth_gguf.py).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..disk.digests import sha256_file
from ..disk.layout_names import MANIFEST_NAME
from ..disk.staging import Staging, check_free_space
from ..gguf.file_types import parse_file_type
from ..gguf.write import OutType, write_gguf
from ..progress import ProgressReporter, ensure
from ..quantize.llama import QuantizeSettings, quantize
from ..source.audio_tokenizer import AudioTokenizer
from .backbone_gguf import plan_backbone
from .checkpoint import RealtimeCheckpoint
from .depth_gguf import matrix_type, write_depth
from .layout import (
    BACKBONE_STEM,
    CODEC_DIR,
    DEPTH_STEM,
    FORMAT,
    config_name,
    gguf_name,
    synth_config,
)

F32 = "F32"
DIRECT = {"F32": OutType.F32, "BF16": OutType.BF16}  # written by the native writer itself


@dataclass(frozen=True)
class RealtimeRequest:
    """What to write: the file types (canonical names), how llama.cpp quantizes, the record."""

    file_types: list[str]
    quantize: QuantizeSettings
    made_from: dict[str, Any]
    source_model: str
    codec_source: str | None
    force: bool = False


@dataclass
class RealtimeFolder:
    output: Path
    ggufs: list[Path]
    configs: list[Path]
    files: list[tuple[str, int]]  # relative path, bytes
    notes: list[str] = field(default_factory=list)


def write_realtime_folder(
    checkpoint: RealtimeCheckpoint,
    codec: AudioTokenizer | None,
    output: Path,
    request: RealtimeRequest,
    progress: ProgressReporter | None = None,
) -> RealtimeFolder:
    bar = ensure(progress)
    types = [parse_file_type(t) for t in request.file_types]
    for t in types:
        matrix_type(t)  # a type the depth GGUF has no rule for: refused before any work
    with Staging(Path(output), force=request.force) as stage:
        folder = stage.path
        check_free_space(folder, checkpoint.total_bytes * (2 + 2 * len(types)), output)
        backbones = _write_backbones(checkpoint, folder, types, request.quantize, bar)
        depths = []
        for t in types:
            name = gguf_name(DEPTH_STEM, t)
            write_depth(checkpoint, folder / name, t, bar)
            depths.append(name)
        for src in checkpoint.tokenizer_files:
            shutil.copyfile(src, folder / src.name)
        shutil.copyfile(checkpoint.root / "config.json", folder / "config.json")
        codec_paths = _copy_codec(codec, folder)
        configs = []
        for i, t in enumerate(types):
            configs.append(folder / config_name(i, t))
            _write_yaml(configs[-1], synth_config(checkpoint, t, codec_paths))
        files = _write_manifest(folder, checkpoint, types, request)
        stage.commit()
    output = Path(output)
    return RealtimeFolder(output, [output / g for g in backbones + depths],
                          [output / c.name for c in configs], files)  # fmt: skip


def _write_backbones(checkpoint: RealtimeCheckpoint, folder: Path, types: list[str],
                     settings: QuantizeSettings, bar: ProgressReporter) -> list[str]:  # fmt: skip
    """Each type's backbone: F32/BF16 by the writer, the rest quantized by llama.cpp from the
    checkpoint's own precision (BF16 when every tensor is bf16, else F32)."""
    names = {t: gguf_name(BACKBONE_STEM, t) for t in types}
    for t in types:
        if t in DIRECT:
            write_gguf(folder / names[t], plan_backbone(checkpoint, DIRECT[t]), bar)
    others = [t for t in types if t not in DIRECT]
    if others:
        base = "BF16" if checkpoint.dtype == "BF16" else F32
        hidden = folder / f".{gguf_name(BACKBONE_STEM, base)}"  # the intermediate, not kept
        source = folder / names[base] if base in types else hidden
        if base not in types:
            write_gguf(source, plan_backbone(checkpoint, DIRECT[base]), bar)
        quantize(source, [folder / names[t] for t in others], others, engine=settings.engine,
                 llama_cpp=settings.llama_cpp, imatrix=settings.imatrix,
                 threads=settings.threads, force=True, progress=bar)  # fmt: skip
        if base not in types:
            os.unlink(source)
    return [names[t] for t in types]


def _copy_codec(codec: AudioTokenizer | None, folder: Path) -> dict | None:
    """The codec's graphs and their data under audio_tokenizer/; their paths from the YAML."""
    if codec is None:
        return None
    for rel in codec.files:
        (folder / CODEC_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(codec.folder / rel, folder / CODEC_DIR / rel)
    encoder = f"{CODEC_DIR}/{codec.encoder.as_posix()}" if codec.encoder else None
    return {"decoder": f"{CODEC_DIR}/{codec.decoder.as_posix()}", "encoder": encoder}


def _write_yaml(path: Path, config: dict[str, Any]) -> None:
    import yaml

    header = (f"# MOSS-TTS-Realtime folder config written by moss-gguf {__version__}; paths "
              f"are relative to this file.\n# Speak: moss-gguf synth --config {path.name} "
              "--text 'Hello' -o hello.wav (24 kHz mono)\n")  # fmt: skip
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def _write_manifest(folder: Path, checkpoint: RealtimeCheckpoint, types: list[str],
                    request: RealtimeRequest) -> list[tuple[str, int]]:  # fmt: skip
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    entries = [{"path": r, "size": (folder / r).stat().st_size, "sha256": sha256_file(folder / r)}
               for r in rels]  # fmt: skip
    rt = checkpoint.realtime
    quant_types = {gguf_name(stem, t): t for t in types for stem in (BACKBONE_STEM, DEPTH_STEM)}
    manifest = {
        "tool": f"moss-gguf {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "format": FORMAT,
        "source_model": request.source_model,
        "quant_types": quant_types,
        "model": {"rvq": rt.rvq, "hidden_size": rt.hidden, "vocab_size": rt.vocab,
                  "backbone_layers": rt.backbone.layers, "depth_layers": rt.depth.layers,
                  "weights_dtype": checkpoint.dtype},
        "audio_tokenizer": request.codec_source,
        "made_from": request.made_from,
        "files": entries,
    }  # fmt: skip
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return [(e["path"], e["size"]) for e in entries]
