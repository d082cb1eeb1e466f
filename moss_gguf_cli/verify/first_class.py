"""`verify` of the first-class `moss-tts-delay` format: a folder `all --format` made, or one GGUF.

Rows: the manifest's files (there, of the listed size and sha256), the tokenizer and codec the
folder needs, each GGUF's header against itself (first_class_read.check_first_class: n_vq against
the audio tensors, every tensor and its shape, the data all there), and with --source every
MOSS key against the source config.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..disk.layout_names import TOKENIZER_DIR
from ..errors import InputError, UsageError
from ..gguf.first_class import ARCH_NAME, MOSS_KEYS, hparams
from ..gguf.first_class_read import check_first_class
from ..gguf.read import GgufFormatError, read_gguf
from ..report import Rows
from ..source.checkpoint import open_checkpoint, resolve_model
from ..source.first_class import moss_value
from .audio_codec import native_codec_rows
from .manifest import format_manifest, manifest_problems
from .result import GROUPS, VerifyReport

KIND = "first-class"


def first_class_manifest(path: Path) -> dict | None:
    """The manifest of a first-class folder, None when path is not one."""
    return format_manifest(path, ARCH_NAME)


def is_first_class(path: Path) -> bool:
    """A first-class folder, or a GGUF file of the moss-tts-delay architecture."""
    path = Path(path).expanduser()
    if path.is_dir():
        return first_class_manifest(path) is not None
    if not path.is_file():
        return False
    try:
        return read_gguf(path).arch == ARCH_NAME
    except (GgufFormatError, OSError):
        return False


def verify_first_class(target: Path, source: str | None, deep: bool) -> VerifyReport:
    """The first-class rows for TARGET (folder or GGUF); failing checks are rows."""
    started = time.perf_counter()
    if deep:
        raise UsageError(
            "--deep runs the GGUF in the stock llama.cpp, which does not know "
            f"the {ARCH_NAME} architecture",
            path=target,
            hint="verify without --deep; run it with the fork's llama-moss-tts",
        )
    path = Path(target).expanduser()
    rows = Rows()
    if path.is_dir():
        ggufs = _folder_rows(path, first_class_manifest(path), rows)
    else:
        ggufs = [path]
    rows.group = "gguf"
    facts = {}
    for g in ggufs:
        try:
            f = check_first_class(g)
        except InputError as exc:
            rows.add(f"{g.name}: first-class header", "fail", exc.message, exc.hint or "")
            continue
        facts = f.keys
        rows.add(
            f"{g.name}: first-class header", "pass",
            f"{ARCH_NAME}, n_vq {f.n_vq}, {f.n_layers} layers, hidden {f.hidden}, every "
            "tensor there with the shape its keys imply",
        )  # fmt: skip
    if source is not None and facts:
        _source_rows(source, facts, rows)
    return VerifyReport(
        target=path, kind=KIND, rows=sorted(rows.rows, key=lambda r: GROUPS.index(r.group)),
        model={k: facts.get(f"{ARCH_NAME}.{k}") for k in MOSS_KEYS},
        seconds=time.perf_counter() - started,
    )  # fmt: skip


def _folder_rows(folder: Path, manifest: dict, rows: Rows) -> list[Path]:
    """The manifest's files and the folder's parts; the GGUFs it lists."""
    rows.group = "manifest"
    problems = manifest_problems(folder, manifest)
    n = len(manifest.get("files") or [])
    rows.check("manifest files", problems, f"{n} files, sizes and sha256 as listed")
    rows.group = "files"
    rows.check(
        "tokenizer",
        [] if (folder / TOKENIZER_DIR / "tokenizer.json").is_file()
        else [f"{TOKENIZER_DIR}/tokenizer.json is missing"],
        f"{TOKENIZER_DIR}/tokenizer.json",
    )  # fmt: skip
    names = sorted(manifest.get("quant_types") or {})
    rows.check("first-class GGUFs", [] if names else ["the manifest lists no GGUF"],
               ", ".join(names))  # fmt: skip
    native_codec_rows(folder, manifest, rows)
    return [folder / n for n in names if (folder / n).is_file()]


def _source_rows(source: str, keys: dict, rows: Rows) -> None:
    """Every MOSS key of the header against the source's config."""
    rows.group = "source"
    ck = open_checkpoint(resolve_model(source))
    hp = hparams(ck.config)
    problems = [
        f"{ARCH_NAME}.{k} = {keys.get(f'{ARCH_NAME}.{k}')}, the source says {moss_value(hp, k)}"
        for k in MOSS_KEYS
        if keys.get(f"{ARCH_NAME}.{k}") != int(moss_value(hp, k))
    ]
    layers = keys.get(f"{ARCH_NAME}.block_count")
    if layers != ck.moss.num_layers:
        problems.append(f"block_count {layers}, the source has {ck.moss.num_layers} layers")
    rows.check("keys vs source", problems, f"{len(MOSS_KEYS)} MOSS keys and the layer count")
