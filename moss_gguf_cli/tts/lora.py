"""LoRA adapters applied by llama.cpp at run time (`synth --lora`, `serve --lora`; docs/lora.md).

An adapter is the adapter GGUF `convert --format lora` writes. Before llama.cpp loads it, the
base it was made for (gguf/lora.py: the dims, the digest of the first audio head, the model)
is checked against the folder being spoken with: llama.cpp checks only the architecture and
the shapes, and an adapter for another MOSS release of the same dims would load silently.
Applying is per context (`llama_set_adapters_lora`): every sequence of a decode gets the same
set, so whoever steps the engine applies one set at a time (the server switches between
batches); a set with every scale 0 is no adapter at all (llama.cpp leaves such an adapter out
of the graph).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, UsageError
from ..gguf.lora import ARCH, backbone_hparams, read_identity, table_digest
from ..gguf.read import GgufFormatError, read_gguf
from ..source.hub import is_repo_id
from .backbone import Backbone

CONVERT_HINT = "convert the PEFT adapter with: moss-gguf convert ADAPTER --format lora --base MODEL"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# the table the adapter's digest is of (gguf/lora.DIGEST_TENSOR in the backend folder)
DIGEST_TABLE = "lm_head_audio_00.npy"


@dataclass(frozen=True)
class LoraSpec:
    """One adapter to load: its file, the scale it is applied with from the start (synth;
    serve's are 0 until a request names them) and its name (what a request says)."""

    path: Path
    scale: float = 1.0
    name: str = ""

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        """`FILE[:SCALE]` (synth --lora)."""
        head, sep, tail = text.rpartition(":")
        if sep and head:
            try:
                return cls(Path(head).expanduser(), float(tail), Path(head).stem)
            except ValueError:
                pass  # a colon in a path: no scale
        return cls(Path(text).expanduser(), 1.0, Path(text).stem)

    @classmethod
    def parse_named(cls, text: str) -> LoraSpec:
        """`NAME=FILE` (serve --lora)."""
        name, sep, path = text.partition("=")
        if not sep or not _NAME.match(name) or not path:
            raise UsageError(f"--lora {text!r}: expected NAME=FILE",
                             hint="NAME: letters, digits, '.', '_', '-'")  # fmt: skip
        return cls(Path(path).expanduser(), 0.0, name)  # off until a request names it


def folder_model(backbone_gguf: Path, model_config: Path | None) -> str:
    """The model a weights folder was made from, as the adapter file names one (repo@commit,
    repo, builtin:NAME), from its manifest or extraction_meta.json; "" when only a local
    folder (no identity) or nothing is known."""
    manifest = backbone_gguf.parent / "manifest.json"
    try:
        source = json.loads(manifest.read_text())["made_from"]["source"]
        if "repo" in source:
            return f"{source['repo']}@{source.get('commit') or ''}".rstrip("@")
        if "model" in source:
            return str(source["model"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        named = str(json.loads(Path(model_config).read_text()).get("source_model") or "")
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
        return ""
    return named if named.startswith("builtin:") or is_repo_id(named) else ""


def _same_model(made_for: str, folder: str) -> bool:
    """Whether two model names agree where both say something: the repo, then the commit."""
    if not made_for or not folder:
        return True
    (repo_a, _, rev_a), (repo_b, _, rev_b) = made_for.partition("@"), folder.partition("@")
    return repo_a == repo_b and (not rev_a or not rev_b or rev_a == rev_b)


def check_adapter(path: Path, backbone_gguf: Path, lm_head_dir: Path, n_vq: int,
                  model_config: Path | None = None) -> None:  # fmt: skip
    """PATH is an adapter GGUF made for the folder's base; else one line saying which not."""
    if not path.is_file():
        raise InputError("adapter GGUF not found", path=path, hint=CONVERT_HINT)
    try:
        g = read_gguf(path)
    except (GgufFormatError, OSError) as exc:
        raise InputError(f"is not a readable GGUF ({exc})", path=path, hint=CONVERT_HINT) from None
    if g.kv.get("general.type") != "adapter" or g.kv.get("adapter.type") != "lora":
        raise InputError("is not a LoRA adapter GGUF (general.type adapter, adapter.type lora)",
                         path=path, hint=CONVERT_HINT)  # fmt: skip
    if g.arch != ARCH:
        raise InputError(f"is an adapter for a {g.arch} model, not qwen3", path=path)
    ident = read_identity(g)
    if ident is None:
        raise InputError("does not say which base it was made for (not written by moss-gguf)",
                         path=path, hint=CONVERT_HINT)  # fmt: skip
    ours = backbone_hparams(read_gguf(backbone_gguf), n_vq)
    differ = sorted(k for k in ident.hparams if ident.hparams[k] != ours.get(k))
    made_for = ident.model or "another base"
    if differ:
        k = differ[0]
        raise InputError(f"was made for {made_for} ({k} {ident.hparams[k]}); this folder's "
                         f"model has {k} {ours.get(k)}", path=path,
                         hint="convert the adapter with this model as --base")  # fmt: skip
    folder = folder_model(backbone_gguf, model_config)
    if not _same_model(ident.model, folder):
        raise InputError(f"was made for {ident.model}; this folder was made from {folder}",
                         path=path, hint="convert it with this model as --base")  # fmt: skip
    table = np.load(lm_head_dir / DIGEST_TABLE, mmap_mode="r")
    if table_digest(table) == ident.digest:
        return
    compared = f"the sha256 of {lm_head_dir / DIGEST_TABLE} against the file's base.digest"
    stored = _first_class_type(lm_head_dir)
    if stored:
        # a folder read back from a first-class GGUF whose audio head was not stored in f16:
        # its table is not the checkpoint's f16 rounding, so the digest can say nothing
        raise InputError(f"cannot be checked against this folder: its first audio head was "
                         f"read back from a {stored} first-class GGUF (extraction_meta.json), "
                         f"so {compared} cannot match even for its own base", path=path,
                         hint="use a folder made from the checkpoint (moss-gguf all --model "
                         "CHECKPOINT), or a first-class file with F16 audio heads")  # fmt: skip
    raise InputError(f"was made for {made_for}, whose weights differ from this folder's "
                     f"({compared})", path=path,
                     hint="use it with the base it was made for, or convert the adapter "
                     "with this model as --base")  # fmt: skip


def _first_class_type(lm_head_dir: Path) -> str:
    """The type the folder's digest table had in the first-class GGUF it was read back from,
    when that was not F16 (extraction_meta.json's first_class); "" otherwise."""
    try:
        made = json.loads((lm_head_dir.parent / "extraction_meta.json").read_text())["first_class"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return ""
    stem = DIGEST_TABLE.removesuffix(".npy")
    if stem in (made.get("dequantized") or []):
        return "quantized"
    return "non-F16" if stem in (made.get("rounded") or []) else ""


def load_adapters(backbone: Backbone, specs: tuple[LoraSpec, ...], lm_head_dir: Path,
                  n_vq: int, model_config: Path | None) -> dict[str, object]:  # fmt: skip
    """SPECS, each checked against the folder, loaded into BACKBONE, by name."""
    loaded: dict[str, object] = {}
    for spec in specs:
        if spec.name in loaded:
            raise UsageError(f"two LoRA adapters are named {spec.name!r}")
        check_adapter(spec.path, backbone.gguf, lm_head_dir, n_vq, model_config)
        loaded[spec.name] = backbone.load_adapter(spec.path)
    return loaded
