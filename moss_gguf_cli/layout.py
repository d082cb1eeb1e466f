"""`layout`: arrange a ready-to-run weights folder and write its synth config and manifest.

The tree is the guide's "Using the Converted Weights": the backbone GGUF(s),
`embeddings/`, `lm_heads/`, `tokenizer/`, plus `extraction_meta.json` (n_vq and
token ids for synth), `moss-tts.yaml` (paths relative to itself) and
`manifest.json` (size and sha256 of every file, for `verify`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from . import __version__
from .checkpoint import TOKENIZER_FILES, read_json
from .digests import sha256_cached
from .errors import InputError, UsageError
from .extract import BACKBONE_DIR, EMBEDDING_DIR, LM_HEAD_DIR, META_NAME
from .holds import hold
from .progress import ProgressReporter, ensure
from .staging import Staging, check_free_space

CONFIG_NAME = "moss-tts.yaml"
MANIFEST_NAME = "manifest.json"
TOKENIZER_DIR = "tokenizer"
AUDIO_TOKENIZER_DIR = "audio_tokenizer"

# synth settings written into the YAML (DESIGN.md §5); upstream's reader knows these keys
SYNTH_DEFAULTS: dict[str, Any] = {
    "audio_backend": "onnx",
    "heads_backend": "auto",  # float16 heads through ggml when available, else NumPy
    "n_ctx": 4096,
    "n_batch": 512,
    "n_threads": 0,  # 0: let llama.cpp pick
    "n_gpu_layers": -1,  # all layers when llama.cpp has a GPU backend; ignored on CPU builds
    "max_new_tokens": 2000,
    "use_gpu_audio": False,
    "kv_cache_type_k": "f16",
    "kv_cache_type_v": "f16",
    "flash_attn": False,
    "text_temperature": 1.5,
    "text_top_p": 1.0,
    "text_top_k": 50,
    "audio_temperature": 1.7,
    "audio_top_p": 0.8,
    "audio_top_k": 25,
    "audio_repetition_penalty": 1.0,
}


class LayoutMode(str, Enum):
    link = "link"
    copy = "copy"
    move = "move"


@dataclass
class ManifestEntry:
    path: str
    size: int
    sha256: str


@dataclass
class LayoutResult:
    output: Path
    config: Path
    manifest: Path
    ggufs: list[Path]
    entries: list[ManifestEntry]
    linked: int = 0
    copied: int = 0
    moved: int = 0
    extra_configs: list[Path] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)


@dataclass(frozen=True)
class Placement:
    """One file to place: where it comes from and its path inside the weights folder."""

    source: Path
    rel: str
    movable: bool = True  # never move what belongs to someone else (the audio tokenizer)


def expected_tables(n_vq: int) -> tuple[list[str], list[str]]:
    emb = ["embed_tokens.npy"] + [f"emb_ext_{i:02d}.npy" for i in range(n_vq)]
    heads = ["lm_head_text.npy"] + [f"lm_head_audio_{i:02d}.npy" for i in range(n_vq)]
    return emb, heads


def read_meta(extracted: Path) -> dict[str, Any]:
    meta_path = extracted / META_NAME
    if not meta_path.is_file():
        raise InputError(
            f"{META_NAME} not found: not an extract output folder",
            path=extracted,
            hint="run `moss-gguf extract` first and pass its --output",
        )
    meta = read_json(meta_path, META_NAME)
    if not isinstance(meta, dict) or not isinstance(meta.get("n_vq"), int):
        raise InputError(
            f"{META_NAME} has no integer n_vq", path=meta_path, hint="re-run `moss-gguf extract`"
        )
    return meta


def plan(extracted: Path, ggufs: list[Path], audio_tokenizer: Path | None) -> list[Placement]:
    meta = read_meta(extracted)
    emb, heads = expected_tables(meta["n_vq"])
    items: list[Placement] = []
    for gguf in ggufs:
        if not gguf.is_file():
            raise InputError("GGUF file not found", path=gguf)
        items.append(Placement(gguf, gguf.name))
    for folder, names in ((EMBEDDING_DIR, emb), (LM_HEAD_DIR, heads)):
        for name in names:
            src = extracted / folder / name
            if not src.is_file():
                raise InputError(
                    f"{folder}/{name} is missing from the extract output",
                    path=extracted,
                    hint="re-run `moss-gguf extract`",
                )
            items.append(Placement(src, f"{folder}/{name}"))
    tok_src = extracted / BACKBONE_DIR
    toks = [n for n in TOKENIZER_FILES if (tok_src / n).is_file()]
    if "tokenizer.json" not in toks:
        raise InputError(
            "tokenizer.json is missing from the extracted backbone",
            path=tok_src,
            hint="re-run `moss-gguf extract` on a checkpoint with tokenizer files",
        )
    items += [Placement(tok_src / n, f"{TOKENIZER_DIR}/{n}") for n in toks]
    items.append(Placement(extracted / META_NAME, META_NAME))
    if audio_tokenizer is not None:
        items += audio_tokenizer_files(audio_tokenizer)
    return items


def audio_tokenizer_files(folder: Path) -> list[Placement]:
    """encoder.onnx / decoder.onnx and any external-data files beside them."""
    if not folder.is_dir():
        raise InputError("audio tokenizer folder not found", path=folder)
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    if "decoder.onnx" not in names:
        raise InputError(
            "no decoder.onnx in the audio tokenizer folder",
            path=folder,
            hint="point --audio-tokenizer at the MOSS-Audio-Tokenizer ONNX folder",
        )
    keep = [n for n in names if n.endswith((".onnx", ".data", ".onnx_data", ".json"))]
    return [Placement(folder / n, f"{AUDIO_TOKENIZER_DIR}/{n}", movable=False) for n in keep]


def _place(src: Path, dest: Path, mode: LayoutMode) -> str:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if mode is LayoutMode.move:
        shutil.move(src, dest)
        return "moved"
    if mode is LayoutMode.link:
        try:
            os.link(src, dest)
            return "linked"
        except OSError:
            pass  # another filesystem, or links not allowed: copy instead
    shutil.copyfile(src, dest)
    return "copied"


def hash_entries(
    root: Path, rels: list[str], progress: ProgressReporter | None = None
) -> list[ManifestEntry]:
    """sha256 every file; hashlib releases the GIL, so two threads use both cores."""
    bar = ensure(progress)
    sizes = {rel: (root / rel).stat().st_size for rel in rels}
    bar.start("hash", "sha256", sum(sizes.values()), "B")

    def one(rel: str) -> ManifestEntry:
        digest = sha256_cached(root / rel)
        bar.advance("hash", sizes[rel])
        return ManifestEntry(rel, sizes[rel], digest)

    with ThreadPoolExecutor(max_workers=2) as pool:
        entries = list(pool.map(one, rels))
    bar.finish("hash")
    return entries


def gguf_file_type(path: Path) -> str | None:
    """The GGUF's llama.cpp file type name (e.g. MOSTLY_Q4_K_M), or None if unreadable."""
    import gguf

    from .quantize import inspect_gguf  # a header reader; GGUFReader parses every token string

    try:
        value = inspect_gguf(path).file_type
        return None if value is None else gguf.LlamaFileType(value).name
    except (InputError, ValueError):
        return None


def synth_config(gguf_rel: str, has_audio: bool, overrides: dict[str, Any] | None) -> dict:
    config: dict[str, Any] = {
        "backbone_gguf": gguf_rel,
        "embedding_dir": EMBEDDING_DIR,
        "lm_head_dir": LM_HEAD_DIR,
        "tokenizer_dir": TOKENIZER_DIR,
    }
    config["audio_backend"] = SYNTH_DEFAULTS["audio_backend"]
    config["audio_encoder_onnx"] = f"{AUDIO_TOKENIZER_DIR}/encoder.onnx" if has_audio else None
    config["audio_decoder_onnx"] = f"{AUDIO_TOKENIZER_DIR}/decoder.onnx" if has_audio else None
    for key, value in SYNTH_DEFAULTS.items():
        config.setdefault(key, value)
    for key, value in (overrides or {}).items():
        if key not in config:
            raise UsageError(f"unknown synth config key {key!r}")
        config[key] = value
    return config


def write_yaml(path: Path, config: dict[str, Any]) -> None:
    header = (
        f"# MOSS-TTS synth config written by moss-gguf {__version__}.\n"
        "# Paths are relative to this file. Run:\n"
        f'#   moss-gguf synth --config {path.name} --text "Hello" --output out.wav\n'
    )
    path.write_text(
        header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )


def layout(
    extracted: Path,
    gguf: Path | list[Path],
    output: Path,
    *,
    mode: LayoutMode | str = LayoutMode.link,
    audio_tokenizer: Path | None = None,
    config_name: str = CONFIG_NAME,
    synth_overrides: dict[str, Any] | None = None,
    source_model: str | None = None,
    force: bool = False,
    progress: ProgressReporter | None = None,
) -> LayoutResult:
    """Arrange OUTPUT from an extract folder and backbone GGUF(s); never half-populated."""
    mode = LayoutMode(mode)
    ggufs = [Path(g) for g in (gguf if isinstance(gguf, list) else [gguf])]
    if not ggufs:
        raise UsageError("no GGUF given", hint="pass --gguf FILE")
    extracted = Path(extracted)
    output = Path(output)
    items = plan(extracted, ggufs, audio_tokenizer)
    meta = read_meta(extracted)  # before any file moves away
    bar = ensure(progress)
    counts = {"linked": 0, "copied": 0, "moved": 0}
    with Staging(output, force=force) as stage:
        # room for what will really be copied: links across filesystems fall back to copies
        dev = stage.path.stat().st_dev
        copies = [
            i
            for i in items
            if (mode is LayoutMode.copy)
            or (i.source.stat().st_dev != dev and (mode is LayoutMode.link or not i.movable))
        ]
        check_free_space(stage.path, sum(i.source.stat().st_size for i in copies), output)
        bar.start("layout", "arrange", len(items), "")
        for item in items:
            how = mode if item.movable or mode is not LayoutMode.move else LayoutMode.link
            counts[_place(item.source, stage.path / item.rel, how)] += 1
            bar.advance("layout")
            hold("layout")
        bar.finish("layout")

        has_audio = audio_tokenizer is not None
        config_path = stage.path / config_name
        write_yaml(config_path, synth_config(ggufs[0].name, has_audio, synth_overrides))
        extra = []
        for g in ggufs[1:]:
            name = f"{Path(config_name).stem}-{g.stem}.yaml"
            write_yaml(stage.path / name, synth_config(g.name, has_audio, synth_overrides))
            extra.append(output / name)

        rels = [i.rel for i in items] + [config_name] + [p.name for p in extra]
        entries = hash_entries(stage.path, rels, bar)
        moss = meta.get("moss_config") or {}
        lang = moss.get("language_config") or {}
        manifest = {
            "tool": f"moss-gguf {__version__}",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "source_model": source_model or meta.get("source_model"),
            "quant_types": {g.name: gguf_file_type(stage.path / g.name) for g in ggufs},
            "model": {
                "n_vq": meta["n_vq"],
                "hidden_size": meta.get("hidden_size"),
                "vocab_size": meta.get("vocab_size"),
                "audio_vocab_size": meta.get("audio_vocab_size"),
                "num_hidden_layers": lang.get("num_hidden_layers"),
                "npy_dtype": meta.get("npy_dtype"),
            },
            "config": config_name,
            "files": [e.__dict__ for e in entries],
        }
        (stage.path / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        stage.commit()
    return LayoutResult(
        output,
        output / config_name,
        output / MANIFEST_NAME,
        [output / g.name for g in ggufs],
        entries,
        extra_configs=extra,
        **counts,
    )
