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

from .. import __version__
from ..disk.digests import HashRecord
from ..disk.layout_names import (
    AUDIO_TOKENIZER_DIR,
    BACKBONE_DIR,
    CONFIG_NAME,
    EMBEDDING_DIR,
    LM_HEAD_DIR,
    MANIFEST_NAME,
    META_NAME,
    TOKENIZER_DIR,
)
from ..disk.staging import Staging, check_free_space
from ..errors import InputError, UsageError
from ..gguf.read import inspect_gguf  # GGUFReader would parse every token string
from ..hold_points import hold
from ..progress import ProgressReporter, ensure
from ..source.audio_tokenizer import AudioTokenizer, open_folder
from ..source.checkpoint import TOKENIZER_FILES, read_json
from ..tts.defaults import SYNTH_DEFAULTS
from .made_from import MadeFrom


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


def plan(
    extracted: Path, ggufs: list[Path], audio_tokenizer: AudioTokenizer | None
) -> list[Placement]:
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


def audio_tokenizer_files(codec: AudioTokenizer) -> list[Placement]:
    """The graphs and their external-data files, under audio_tokenizer/ as in their folder."""
    return [
        Placement(codec.folder / rel, f"{AUDIO_TOKENIZER_DIR}/{rel.as_posix()}", movable=False)
        for rel in codec.files
    ]


def _place(src: Path, dest: Path, mode: LayoutMode) -> str:
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = src.resolve()  # a Hub snapshot holds symlinks into its blobs: place the blob
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
    root: Path,
    rels: list[str],
    progress: ProgressReporter | None = None,
    record: HashRecord | None = None,
) -> list[ManifestEntry]:
    """sha256 every file (RECORD's digest where the run took one already, and RECORD gets
    the rest); hashlib releases the GIL, so two threads use both cores."""
    bar = ensure(progress)
    record = record if record is not None else HashRecord()
    sizes = {rel: (root / rel).stat().st_size for rel in rels}
    bar.start("hash", "sha256", sum(sizes.values()), "B")

    def one(rel: str) -> ManifestEntry:
        digest = record.sha256(root / rel)
        bar.advance("hash", sizes[rel])
        return ManifestEntry(rel, sizes[rel], digest)

    with ThreadPoolExecutor(max_workers=2) as pool:
        entries = list(pool.map(one, rels))
    bar.finish("hash")
    return entries


def gguf_file_type(path: Path) -> str | None:
    """The GGUF's llama.cpp file type name (e.g. MOSTLY_Q4_K_M), or None if unreadable."""
    import gguf


    try:
        value = inspect_gguf(path).file_type
        return None if value is None else gguf.LlamaFileType(value).name
    except (InputError, ValueError):
        return None


def synth_config(
    gguf_rel: str, codec: AudioTokenizer | None, overrides: dict[str, Any] | None
) -> dict:
    config: dict[str, Any] = {
        "backbone_gguf": gguf_rel,
        "embedding_dir": EMBEDDING_DIR,
        "lm_head_dir": LM_HEAD_DIR,
        "tokenizer_dir": TOKENIZER_DIR,
    }
    config["audio_backend"] = SYNTH_DEFAULTS["audio_backend"]
    enc = codec.encoder if codec is not None else None
    dec = codec.decoder if codec is not None else None
    config["audio_encoder_onnx"] = f"{AUDIO_TOKENIZER_DIR}/{enc.as_posix()}" if enc else None
    config["audio_decoder_onnx"] = f"{AUDIO_TOKENIZER_DIR}/{dec.as_posix()}" if dec else None
    for key, value in SYNTH_DEFAULTS.items():
        config.setdefault(key, value)
    for key, value in (overrides or {}).items():
        if key not in config:
            raise UsageError(f"unknown synth config key {key!r}")
        config[key] = value
    return config


def write_yaml(path: Path, config: dict[str, Any], lora: list[dict] | None = None) -> None:
    header = (
        f"# MOSS-TTS synth config written by moss-gguf {__version__}.\n"
        "# Paths are relative to this file. Run:\n"
        f'#   moss-gguf synth --config {path.name} --text "Hello" --output out.wav\n'
    )
    for entry in lora or []:  # a merged model says so where its user looks
        header += f"# Merged LoRA adapter: {entry['adapter']} (scale {entry['scale']:g})\n"
    path.write_text(
        header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )


def layout(
    extracted: Path,
    gguf: Path | list[Path],
    output: Path,
    *,
    mode: LayoutMode | str = LayoutMode.link,
    audio_tokenizer: AudioTokenizer | Path | None = None,
    config_name: str = CONFIG_NAME,
    synth_overrides: dict[str, Any] | None = None,
    source_model: str | None = None,
    made_from: MadeFrom | None = None,
    force: bool = False,
    progress: ProgressReporter | None = None,
    record: HashRecord | None = None,
) -> LayoutResult:
    """Arrange OUTPUT from an extract folder and backbone GGUF(s); never half-populated.
    RECORD: the run's hash record (the manifest reuses its digests)."""
    mode = LayoutMode(mode)
    ggufs = [Path(g) for g in (gguf if isinstance(gguf, list) else [gguf])]
    if not ggufs:
        raise UsageError("no GGUF given", hint="pass --gguf FILE")
    extracted = Path(extracted)
    output = Path(output)
    if isinstance(audio_tokenizer, (str, Path)):
        audio_tokenizer = open_folder(Path(audio_tokenizer))
    items = plan(extracted, ggufs, audio_tokenizer)
    meta = read_meta(extracted)  # before any file moves away
    return arrange(
        items, meta, [g.name for g in ggufs], output, mode=mode, codec=audio_tokenizer,
        config_name=config_name, synth_overrides=synth_overrides, source_model=source_model,
        made_from=made_from, force=force, progress=progress, record=record,
    )  # fmt: skip


def arrange(
    items: list[Placement],
    meta: dict[str, Any],
    gguf_names: list[str],
    output: Path,
    *,
    mode: LayoutMode = LayoutMode.link,
    codec: AudioTokenizer | None = None,
    config_name: str = CONFIG_NAME,
    synth_overrides: dict[str, Any] | None = None,
    source_model: str | None = None,
    made_from: MadeFrom | None = None,
    source_check: str | None = None,
    force: bool = False,
    progress: ProgressReporter | None = None,
    record: HashRecord | None = None,
) -> LayoutResult:
    """Place ITEMS into OUTPUT (staged, renamed when complete), then write YAML(s) and manifest."""
    mode = LayoutMode(mode)
    output = Path(output)
    ggufs = [Path(n) for n in gguf_names]
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

        config_path = stage.path / config_name
        lora = made_from.lora if made_from is not None else []
        write_yaml(config_path, synth_config(ggufs[0].name, codec, synth_overrides), lora)
        extra = []
        for g in ggufs[1:]:
            name = f"{Path(config_name).stem}-{g.stem}.yaml"
            write_yaml(stage.path / name, synth_config(g.name, codec, synth_overrides), lora)
            extra.append(output / name)

        rels = [i.rel for i in items] + [config_name] + [p.name for p in extra]
        entries = hash_entries(stage.path, rels, bar, record)
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
            "audio_tokenizer": codec.source if codec is not None else None,
            "checks": _checks(source_check, codec),
            "made_from": made_from.to_json() if made_from is not None else None,
            "card": "README.md",  # the model card: outside "files" (pipeline/card.py)
            "lora": lora,  # merged adapters: id or path, scale, sha256 of their files
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


def _checks(source_check: str | None, codec: AudioTokenizer | None) -> dict[str, str]:
    """What the downloaded inputs' hashes were checked against (verify shows it)."""
    out = {}
    if source_check is not None:
        out["source"] = source_check
    if codec is not None:
        out["audio_tokenizer"] = codec.checked
    return out


@dataclass
class CodecResult:
    output: Path
    codec: AudioTokenizer
    configs: list[Path]
    entries: list[ManifestEntry]


def add_audio_tokenizer(
    output: Path, codec: AudioTokenizer, progress: ProgressReporter | None = None
) -> CodecResult:
    """Put CODEC into an existing weights folder: audio_tokenizer/, every YAML, the manifest."""
    output = Path(output)
    manifest_path = output / MANIFEST_NAME
    if not manifest_path.is_file():
        raise InputError(
            f"{MANIFEST_NAME} not found: not a weights folder",
            path=output,
            hint="pass the --output of `moss-gguf all` or `layout`, or --extracted and --gguf",
        )
    manifest = read_json(manifest_path, MANIFEST_NAME)
    configs = sorted(
        p for p in output.glob("*.yaml")
        if isinstance(data := yaml.safe_load(p.read_text(encoding="utf-8")), dict)
        and "backbone_gguf" in data
    )  # fmt: skip
    items = audio_tokenizer_files(codec)
    bar = ensure(progress)
    with Staging(output / AUDIO_TOKENIZER_DIR, force=True) as stage:
        for item in items:
            rel = Path(item.rel).relative_to(AUDIO_TOKENIZER_DIR)
            _place(item.source, stage.path / rel, LayoutMode.link)
        stage.commit()
    enc = f"{AUDIO_TOKENIZER_DIR}/{codec.encoder.as_posix()}" if codec.encoder else None
    for path in configs:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data["audio_encoder_onnx"] = enc
        data["audio_decoder_onnx"] = f"{AUDIO_TOKENIZER_DIR}/{codec.decoder.as_posix()}"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        write_yaml(tmp, data, manifest.get("lora"))
        os.replace(tmp, path)
    kept = [
        f for f in manifest.get("files", [])
        if not f["path"].startswith(AUDIO_TOKENIZER_DIR + "/")
        and f["path"] not in {p.name for p in configs}
    ]  # fmt: skip
    rels = [i.rel for i in items] + [p.name for p in configs]
    entries = hash_entries(output, rels, bar)
    manifest["files"] = kept + [e.__dict__ for e in entries]
    manifest["audio_tokenizer"] = codec.source
    manifest.setdefault("checks", {})["audio_tokenizer"] = codec.checked
    tmp = manifest_path.with_name(f".{MANIFEST_NAME}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, manifest_path)
    return CodecResult(output, codec, configs, entries)
