"""The model card: README.md of every output folder, as the Hub reads a quantized GGUF's card.

YAML front matter (huggingface_hub's ModelCardData: base_model, base_model_relation quantized,
pipeline_tag, library_name, tags, the source card's license and language), then what the folder
holds, verify's result, how to run it, every file's sha256, and what made it. The card is
written after verify and lies outside manifest.json's files (the manifest names it under
"card"): verify checks the manifest's files, and the card reports verify's result.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from ..disk.confine import present
from ..disk.layout_names import MANIFEST_NAME
from ..disk.staging import human_bytes
from ..errors import UsageError
from ..gguf.read import GgufFormatError, read_gguf
from ..source.hub import cache_folder, cached_commit, is_repo_id

log = logging.getLogger(__name__)

CARD_NAME = "README.md"
FAMILY_TAG = "moss-tts"
HUB = "https://huggingface.co"


@dataclass
class CardSource:
    """What the card says the folder was made from."""

    base_model: str | None  # a Hub repo id; None: left out of the metadata
    revision: str | None = None  # the commit converted, where known
    card: Path | None = None  # the source's own README.md, for license and language
    notes: list[str] = field(default_factory=list)
    laid_out_from: str | None = None  # weights converted elsewhere, only laid out here


def relaid(source: CardSource, model: str) -> CardSource:
    """The card's source for a folder laid out from weights already converted (a GGUF repo, a
    pushed folder, a first-class GGUF): nothing was quantized here, so no base_model relation
    is claimed; the body names where the weights came from."""
    return CardSource(None, source.revision, None, laid_out_from=model)


def card_source(
    model: str, revision: str | None, cache_dir: Path | None, base_model: str | None = None
) -> CardSource:
    """MODEL as the card names it: a Hub id (its cached commit and card), a local folder
    (--base-model, else its config's _name_or_path), or builtin (no base model)."""
    folder = Path(model).expanduser()
    if base_model is not None and not is_repo_id(base_model):
        raise UsageError(f"--base-model {base_model!r} is not a Hub repo id",
                         hint="give it as OWNER/NAME, e.g. OpenMOSS-Team/MOSS-TTS")  # fmt: skip
    if not model.startswith("builtin:") and not folder.exists() and is_repo_id(model):
        commit = cached_commit(model, revision, cache_dir)
        snap = cache_folder(model, cache_dir) / "snapshots" / (commit or "?")
        readme = snap / CARD_NAME
        return CardSource(base_model or model, commit or revision,
                          readme if readme.is_file() else None)  # fmt: skip
    readme = folder / CARD_NAME if folder.is_dir() else None
    found = base_model or _name_or_path(folder)
    source = CardSource(found, None, readme if readme and readme.is_file() else None)
    if found is None:
        source.notes.append(
            "the model card has no base_model: the source is not a Hub repo; "
            "pass --base-model OWNER/NAME to name the model it was converted from"
        )
    return source


def _name_or_path(folder: Path) -> str | None:
    """The checkpoint config's own _name_or_path, when it is a Hub repo id."""
    path = folder / "config.json"
    if not present(path):  # a FIFO or a device there is refused, never opened
        return None
    try:
        name = json.loads(path.read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return name if isinstance(name, str) and is_repo_id(name) else None


def source_meta(card: Path | None) -> dict:
    """license, license_link and language from the source's card, where it has them."""
    if card is None:
        return {}
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(card).data.to_dict()
    except Exception as exc:  # a card we cannot read costs only its license line
        log.warning("the source's README.md is not a readable model card (%s)", exc)
        return {}
    return {k: data[k] for k in ("license", "license_name", "license_link", "language")
            if data.get(k)}  # fmt: skip


@dataclass
class CardFile:
    path: str
    kind: str
    size: int
    sha256: str
    bpw: float | None = None  # GGUFs: bits per weight over the tensor data


def card_files(folder: Path) -> list[CardFile]:
    """The manifest's files, each with its type (and a GGUF's bits per weight)."""
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    types = manifest.get("quant_types") or {}
    out = []
    for f in manifest["files"]:
        rel, kind, bpw = f["path"], _kind(f["path"]), None
        if rel in types:
            kind = f"GGUF {str(types[rel] or '?').removeprefix('MOSTLY_')}"
            bpw = _bits_per_weight(folder / rel)
        elif rel.endswith(".gguf"):
            bpw = _bits_per_weight(folder / rel)
        out.append(CardFile(rel, kind, int(f["size"]), str(f["sha256"]), bpw))
    return out


def _kind(rel: str) -> str:
    suffix = Path(rel).suffix.lower()
    return {".gguf": "GGUF", ".npy": "NumPy table", ".onnx": "ONNX", ".json": "JSON",
            ".yaml": "synth config", ".data": "ONNX data"}.get(suffix, "file")  # fmt: skip


def _bits_per_weight(path: Path) -> float | None:
    try:
        g = read_gguf(path)
    except (OSError, GgufFormatError):
        return None
    n = sum(t.n_elements for t in g.tensors.values())
    return 8 * sum(t.nbytes for t in g.tensors.values()) / n if n else None


@dataclass
class CardFacts:
    """Everything the card says besides the folder's files."""

    source: CardSource
    verified: str  # verify's result, one line
    command: str  # the command that made the folder
    first_class: str | None = None  # the first-class folder's own README (the fork's lines)


def metadata(source: CardSource):
    """The front matter as huggingface_hub's ModelCardData."""
    from huggingface_hub import ModelCardData

    meta = {"base_model": source.base_model,
            "base_model_relation": "quantized" if source.base_model else None}  # fmt: skip
    return ModelCardData(
        **{k: v for k, v in meta.items() if v},
        pipeline_tag="text-to-speech",
        library_name="gguf",
        tags=["gguf", FAMILY_TAG, "moss-gguf", "text-to-speech"],
        **source_meta(source.card),
    )


def card_text(folder: Path, facts: CardFacts) -> str:
    """The whole README.md."""
    data = metadata(facts.source)
    files = card_files(folder)
    parts = [f"---\n{data.to_yaml()}\n---\n"]
    if facts.first_class is not None:
        parts.append(facts.first_class.rstrip() + "\n")
    else:
        parts.append(_backend_intro(folder))
    parts += [_source_section(facts.source, data), _files_section(files),
              f"## Verified\n\n`moss-gguf verify`: {facts.verified}\n",
              _run_section(folder, facts.first_class is not None),
              _sha_section(files), _made_section(facts.command)]  # fmt: skip
    return "\n".join(parts)


def _backend_intro(folder: Path) -> str:
    return ("# MOSS-TTS GGUF (moss-gguf backend layout)\n\n"
            "A Qwen3 backbone GGUF for llama.cpp with the MOSS-TTS embedding and head tables "
            "beside it as `.npy` files, a synth config and an audio tokenizer, as "
            "[moss-gguf](https://pypi.org/project/moss-gguf/) writes it.\n")  # fmt: skip


def _source_section(source: CardSource, data) -> str:
    if source.laid_out_from is not None:
        name = source.laid_out_from
        shown = f"[{name}]({HUB}/{name})" if is_repo_id(name) else f"`{name}`"
        at = f" at commit `{source.revision}`" if source.revision else ""
        return f"## Source\n\nLaid out from the converted weights {shown}{at}; nothing was " \
               "quantized here.\n"
    if source.base_model is None:
        return "## Source\n\nConverted from a local checkpoint (not named on the Hub).\n"
    at = f" at commit `{source.revision}`" if source.revision else ""
    lines = [f"## Source\n\nQuantized from [{source.base_model}]({HUB}/{source.base_model}){at}."]
    lic = getattr(data, "license", None)
    if lic:
        link = getattr(data, "license_link", None) or f"{HUB}/{source.base_model}"
        lines.append(f"License: `{lic}`, as the source's card says; read it at {link}.")
    return "\n".join(lines) + "\n"


def _files_section(files: list[CardFile]) -> str:
    """Each GGUF and top-level file on a row; a folder's other files on one row (short)."""
    rows = ["## Files\n", "| file | type | size | bits per weight |", "|---|---|---|---|"]
    groups: dict[str, list[CardFile]] = {}
    for f in files:
        top = f.path.split("/", 1)[0]
        if f.bpw is not None or "/" not in f.path:
            bpw = f"{f.bpw:.2f}" if f.bpw is not None else ""
            rows.append(f"| `{f.path}` | {f.kind} | {human_bytes(f.size)} | {bpw} |")
        else:
            groups.setdefault(f"{top}/", []).append(f)
    for top, members in groups.items():
        kinds = ", ".join(sorted({m.kind for m in members}))
        size = human_bytes(sum(m.size for m in members))
        rows.append(f"| `{top}` | {len(members)} files: {kinds} | {size} | |")
    return "\n".join(rows) + "\n"


def _run_section(folder: Path, first_class: bool) -> str:
    if first_class:
        return ("## Run it with moss-gguf\n\nRead it back into the layout `moss-gguf synth` "
                "speaks:\n\n    moss-gguf all --model REPO_ID --output weights\n")  # fmt: skip
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    config = manifest.get("config", "moss-tts.yaml")
    return (
        "## Run it\n\n    pip install moss-gguf\n"
        "    moss-gguf all --model REPO_ID --output weights   # download and check every file\n"
        f'    moss-gguf synth --config weights/{config} --text "Hello" --output hello.wav\n'
        f"    moss-gguf serve --config weights/{config}\n"
    )


def _sha_section(files: list[CardFile]) -> str:
    body = "\n".join(f"{f.sha256}  {f.path}" for f in files)
    return f"## sha256\n\n```\n{body}\n```\n"


def _made_section(command: str) -> str:
    return f"## Made by\n\nmoss-gguf {__version__}:\n\n```\n{command}\n```\n"


def write_card(folder: Path, facts: CardFacts) -> Path:
    """README.md in FOLDER (written whole, then renamed into place; left as it is when a
    rerun would write the same card)."""
    path = Path(folder) / CARD_NAME
    text = card_text(Path(folder), facts)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return path
    tmp = path.with_name(f".{CARD_NAME}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
