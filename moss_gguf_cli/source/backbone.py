"""The Qwen3 backbone wherever it lives: an extracted ``qwen3_backbone/`` folder, a whole
extract output folder, or a MOSS-TTS checkpoint (its ``language_model.*`` and ``lm_heads.0``
read in place). `open_backbone` finds its config, tokenizer and tensors; `plan_native` checks
them into what the native GGUF writer needs. convert, the direct quantize engine, verify and
the torch reference all open a backbone here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..disk.layout_names import BACKBONE_DIR, META_NAME
from ..errors import InputError, UnsupportedModelError
from ..gguf.vocab import read_vocab
from ..gguf.write import (
    GGUFPlan,
    GGUFTensor,
    OutType,
    Qwen3Params,
    SourceTensor,
    plan_backbone_tensors,
)
from .checkpoint import MossCheckpoint, MossConfig, open_checkpoint, read_json, read_tensors

QWEN3_ARCH = "Qwen3ForCausalLM"
TOKENIZER_REQUIRED = ("tokenizer.json", "tokenizer_config.json")
INPUT_HINT = (
    "point INPUT at an extracted qwen3_backbone/ folder, an extract output folder "
    "or a MOSS-TTS checkpoint folder"
)

@dataclass
class Backbone:
    """A Qwen3 backbone, wherever it lives."""

    kind: str  # "backbone" (HF folder), "extract" (extract output) or "moss" (source)
    root: Path  # the HF backbone folder, or the MOSS source folder
    config: dict[str, Any]  # the backbone's Qwen3 config (for "moss": the language config)
    config_path: Path
    tokenizer_dir: Path
    tensors: dict[str, SourceTensor]  # keyed by Qwen3ForCausalLM name
    name: str  # general.name

    @property
    def params(self) -> Qwen3Params:
        return Qwen3Params.from_config(self.config, self.config_path)


def backbone_config(ck: MossCheckpoint) -> dict:
    config = dict(ck.language_config)
    config.pop("_name_or_path", None)
    config["architectures"] = ["Qwen3ForCausalLM"]
    config["model_type"] = "qwen3"
    config.setdefault("torch_dtype", "bfloat16")
    # lm_heads.0 is its own tensor: the backbone must keep lm_head, so never declare it tied
    config["tie_word_embeddings"] = False
    return config


def _safetensors_sources(root: Path) -> dict[str, SourceTensor]:
    """Tensors of a Hugging Face folder (index + shards, or one model.safetensors)."""
    _, refs = read_tensors(root)
    return {
        name: SourceTensor(name, ref.path, ref.dtype, tuple(ref.shape), ref.offset, ref.nbytes)
        for name, ref in refs.items()
    }


def _meta_name(meta_path: Path) -> str | None:
    """'<variant> backbone' from an extraction_meta.json, so every input gives the same GGUF."""
    if not meta_path.is_file():
        return None
    try:
        meta = read_json(meta_path, "extraction_meta.json")
        return f"{MossConfig.from_dict(meta['moss_config']).variant} backbone"
    except (InputError, KeyError, TypeError):
        return None


def open_backbone(input: Path | MossCheckpoint) -> Backbone:
    """Find out what INPUT is and where the backbone's config, tokenizer and tensors are;
    an opened checkpoint (`all` opens it once) is used as it is."""
    if isinstance(input, MossCheckpoint):
        backbone = _moss_backbone(input)
    else:
        backbone = _find_backbone(Path(input))
    for fname in TOKENIZER_REQUIRED:
        if not (backbone.tokenizer_dir / fname).is_file():
            raise InputError(
                f"tokenizer file {fname} is missing",
                path=backbone.tokenizer_dir,
                hint="copy the model's tokenizer files into this folder",
            )
    if backbone.kind != "moss":
        backbone.tensors = _safetensors_sources(backbone.root)
    return backbone


def _moss_backbone(ck: MossCheckpoint) -> Backbone:
    """The backbone inside a MOSS checkpoint, its tensors read in place."""
    return Backbone(
        kind="moss",
        root=ck.root,
        config=backbone_config(ck),
        config_path=ck.root / "config.json",
        tokenizer_dir=ck.root,
        tensors={
            name: SourceTensor(
                ref.name, ref.path, ref.dtype, tuple(ref.shape), ref.offset, ref.nbytes,
                ref.delta,
            )
            for name, ref in ck.backbone_tensors()
        },
        name=f"{ck.moss.variant} backbone",
    )


def _find_backbone(path: Path) -> Backbone:
    """What the folder PATH is: a backbone, an extract output, or a MOSS checkpoint."""
    if not path.exists():
        raise InputError("input folder not found", path=path, hint=INPUT_HINT)
    if not path.is_dir():
        raise InputError("expected a folder, got a file", path=path, hint=INPUT_HINT)
    kind = "backbone"
    root = path
    meta_name = _meta_name(path.parent / META_NAME)
    if not (path / "config.json").is_file() and (
        (path / META_NAME).is_file() or (path / BACKBONE_DIR).is_dir()
    ):
        kind, root = "extract", path / BACKBONE_DIR
        meta_name = _meta_name(path / META_NAME)
        if not root.is_dir():
            raise InputError(
                f"extract output has no {BACKBONE_DIR}/ folder",
                path=path,
                hint="re-run moss-gguf extract",
            )
    config_path = root / "config.json"
    if not config_path.is_file():
        raise InputError("config.json is missing", path=root, hint=INPUT_HINT)
    config = read_json(config_path, "config.json")
    if not isinstance(config, dict):
        raise InputError("config.json is not a JSON object", path=config_path)

    if "language_config" in config:
        # refuses MOSS look-alikes, checks every tensor's shape
        return _moss_backbone(open_checkpoint(root))
    archs = config.get("architectures") or []
    arch = str(archs[0]) if archs else ""
    if arch != QWEN3_ARCH:
        what = arch or f"model_type {config.get('model_type', 'missing')!r}"
        raise UnsupportedModelError(
            f"architecture {what} is neither {QWEN3_ARCH} nor MOSS-TTS",
            path=config_path,
            hint=INPUT_HINT,
        )
    return Backbone(
        kind=kind,
        root=root,
        config=config,
        config_path=config_path,
        tokenizer_dir=root,
        tensors={},
        name=meta_name or root.name,
    )


def plan_native(
    backbone: Backbone, outtype: OutType, tensors: list[GGUFTensor] | None = None
) -> GGUFPlan:
    """Everything the native writer needs, checked: tensors, types, vocabulary."""
    hp = backbone.params
    if tensors is None:
        tensors = plan_backbone_tensors(hp, backbone.tensors, outtype, backbone.root)
    vocab = read_vocab(backbone.tokenizer_dir, backbone.config, hp.vocab)
    return GGUFPlan(hp, tensors, vocab, outtype, backbone.name)
