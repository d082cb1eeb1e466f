"""Write the Nano folder (nano/layout.py) from an opened checkpoint, staged: it appears under
OUTPUT only when every file is written and hashed; a failure leaves nothing behind.

The global transformer is written once as an F32 GGUF inside the staging folder and quantized
from it by llama.cpp (quantize/llama.py: llama-quantize, or libllama in-process) to each
requested file type; an F32 request keeps that file itself. The direct engine is for the delay
family's checkpoints and is not used here.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..disk.digests import sha256_file
from ..disk.layout_names import MANIFEST_NAME
from ..disk.staging import Staging, check_free_space
from ..errors import InputError
from ..gguf.file_types import parse_file_type
from ..progress import ProgressReporter, ensure
from ..quantize.llama import QuantizeSettings, quantize
from .checkpoint import NanoCheckpoint
from .codec_folder import NanoCodec
from .global_gguf import write_global_f32
from .layout import (
    CODEC_DIR,
    FORMAT,
    TOKENIZER_NAME,
    array_files,
    array_of,
    config_name,
    gguf_name,
    synth_config,
)

F32 = "F32"


@dataclass
class NanoFolder:
    output: Path
    ggufs: list[Path]
    configs: list[Path]
    files: list[tuple[str, int]]  # relative path, bytes
    codec: str | None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NanoRequest:
    """What to write: the file types (canonical names), how llama.cpp quantizes, the record."""

    file_types: list[str]
    quantize: QuantizeSettings
    made_from: dict[str, Any]
    source_model: str
    codec_source: str | None  # what --audio-tokenizer named (repo id, folder, builtin)
    force: bool = False


def write_nano_folder(
    checkpoint: NanoCheckpoint,
    codec: NanoCodec | None,
    output: Path,
    request: NanoRequest,
    progress: ProgressReporter | None = None,
) -> NanoFolder:
    """The Nano folder at OUTPUT; refuses, before anything is written, a checkpoint without
    tokenizer.model (the folder could not speak: check_complete)."""
    bar = ensure(progress)
    check_complete(checkpoint)
    types = [parse_file_type(t) for t in request.file_types]
    with Staging(Path(output), force=request.force) as stage:
        check_free_space(stage.path, _planned_bytes(checkpoint, codec, len(types)), output)
        ggufs = _write_ggufs(checkpoint, stage.path, types, request.quantize, bar)
        _write_arrays(checkpoint, stage.path, bar)
        shutil.copyfile(checkpoint.tokenizer, stage.path / TOKENIZER_NAME)
        shutil.copyfile(checkpoint.root / "config.json", stage.path / "config.json")
        codec_dir = _copy_codec(codec, stage.path)
        configs = []
        for i, gguf in enumerate(ggufs):
            configs.append(stage.path / config_name(i, gguf))
            _write_yaml(configs[-1], synth_config(checkpoint, gguf, codec_dir))
        files = _write_manifest(stage.path, checkpoint, dict(zip(ggufs, types, strict=True)),
                                request)  # fmt: skip
        stage.commit()
    output = Path(output)
    note = checkpoint.dtype_note
    return NanoFolder(output, [output / g for g in ggufs], [output / c.name for c in configs],
                      files, codec_dir, [note] if note else [])  # fmt: skip


def check_complete(checkpoint: NanoCheckpoint) -> None:
    """Refuse a checkpoint the folder cannot be made of: one without tokenizer.model."""
    if checkpoint.tokenizer is None:
        raise InputError(f"{TOKENIZER_NAME} is missing; the Nano folder needs the release's",
                         path=checkpoint.root, hint="download the whole release")  # fmt: skip


def _planned_bytes(checkpoint: NanoCheckpoint, codec: NanoCodec | None, n_types: int) -> int:
    """Room for the F32 GGUF, each output at most its size, the arrays and the codec."""
    f32 = sum(4 * a.size for n, a in checkpoint.tensors.items() if not n.startswith("local"))
    codec_bytes = sum((codec.folder / f).stat().st_size for f in codec.files) if codec else 0
    return f32 * (1 + n_types) + codec_bytes + (64 << 20)


def _write_ggufs(checkpoint: NanoCheckpoint, folder: Path, types: list[str],
                 settings: QuantizeSettings, bar: ProgressReporter) -> list[str]:  # fmt: skip
    """The F32 GGUF, then llama.cpp's quantization of it to each other type."""
    f32 = write_global_f32(checkpoint, folder / f".{gguf_name(F32)}.partial")
    others = [t for t in types if t != F32]
    if others:
        quantize(f32, [folder / gguf_name(t) for t in others], others, engine=settings.engine,
                 llama_cpp=settings.llama_cpp, imatrix=settings.imatrix,
                 threads=settings.threads, force=True, progress=bar)  # fmt: skip
    if F32 in types:
        os.replace(f32, folder / gguf_name(F32))
    else:
        f32.unlink()
    return [gguf_name(t) for t in types]


def _write_arrays(checkpoint: NanoCheckpoint, folder: Path, bar: ProgressReporter) -> None:
    files = array_files(checkpoint.nano)
    bar.start("arrays", "tables and local transformer", len(files), "")
    for rel, source in files.items():
        (folder / rel).parent.mkdir(exist_ok=True)
        np.save(folder / rel, array_of(checkpoint, source), allow_pickle=False)
        bar.advance("arrays")
    bar.finish("arrays")


def _copy_codec(codec: NanoCodec | None, folder: Path) -> str | None:
    """The codec's files (meta, graphs, external data) under audio_tokenizer/, as laid out."""
    if codec is None:
        return None
    for rel in codec.files:
        (folder / CODEC_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(codec.folder / rel, folder / CODEC_DIR / rel)
    return CODEC_DIR


def _write_yaml(path: Path, config: dict[str, Any]) -> None:
    import yaml

    header = (f"# MOSS-TTS-Nano folder config written by moss-gguf {__version__}; paths are "
              f"relative to this file.\n# Speak: moss-gguf synth --config {path.name} --text "
              "'Hello' -o hello.wav (48 kHz stereo); moss-gguf serve --config " + path.name
              + "\n")  # fmt: skip
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def _write_manifest(folder: Path, checkpoint: NanoCheckpoint, ggufs: dict[str, str],
                    request: NanoRequest) -> list[tuple[str, int]]:  # fmt: skip
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    entries = [{"path": r, "size": (folder / r).stat().st_size, "sha256": sha256_file(folder / r)}
               for r in rels]  # fmt: skip
    dims = checkpoint.nano.dims
    manifest = {
        "tool": f"moss-gguf {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "format": FORMAT,
        "source_model": request.source_model,
        "quant_types": ggufs,
        "model": {"n_vq": checkpoint.nano.n_vq, "hidden_size": dims.hidden,
                  "vocab_size": dims.vocab, "num_layers": dims.layers,
                  "local_layers": checkpoint.nano.local_layers, "npy_dtype": "float32"},
        "audio_tokenizer": request.codec_source,
        "made_from": request.made_from,
        "files": entries,
    }  # fmt: skip
    if checkpoint.dtype_note:  # only then: a folder whose config agrees keeps its manifest as is
        manifest["model"].update(weights_dtype=checkpoint.dtype,
                                 config_dtype=checkpoint.config_dtype)  # fmt: skip
        manifest["notes"] = [checkpoint.dtype_note]
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return [(e["path"], e["size"]) for e in entries]
