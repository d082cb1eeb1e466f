"""A MOSS-TTS checkpoint planned as the first-class `moss-tts-delay` GGUF (gguf/first_class.py
holds the format: its names, keys and header). No tensor data is read here: the plan says
which source tensor becomes which GGUF tensor, of which type, in the fork converter's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from ..errors import InputError, UnsupportedModelError, UsageError
from ..gguf.first_class import (
    ARCH_NAME,
    MOSS_KEYS,
    FirstClassPlan,
    gguf_name,
    hparams,
    model_card,
    parse_audio_tables_type,
)
from ..gguf.stream import SOURCE_DTYPES, GGUFTensor, SourceTensor
from ..gguf.vocab import read_vocab
from ..gguf.write import OutType, Qwen3Params, tensor_qtype
from .backbone import backbone_config
from .checkpoint import MossCheckpoint, MossConfig, open_checkpoint


def _source(name: str, ref: Any) -> SourceTensor:
    return SourceTensor(name, ref.path, ref.dtype, tuple(ref.shape), ref.offset, ref.nbytes,
                        ref.delta)  # fmt: skip


def plan_first_class_tensors(ck: MossCheckpoint, outtype: OutType) -> list[GGUFTensor]:
    """Every tensor of the checkpoint, named, typed and ordered as the fork's converter does."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, ck.moss.num_layers)
    planned = []
    order = sorted(ck.tensors.items(), key=lambda item: (item[1].path.name, item[0]))
    for name, ref in order:
        if name.endswith(".rotary_emb.inv_freq"):
            continue  # the converter drops these buffers: llama.cpp recomputes them
        new = gguf_name(name, names)
        if new is None:
            raise UnsupportedModelError(
                f"tensor {name!r} has no place in a {ARCH_NAME} GGUF",
                path=ref.path,
                hint="only MOSS-TTS delay checkpoints (language_model.*, emb_ext.*, "
                "lm_heads.*) convert to this format",
            )
        if ref.dtype not in SOURCE_DTYPES:
            raise InputError(
                f"tensor {name!r} has dtype {ref.dtype}; expected BF16, F16 or F32", path=ref.path
            )
        qtype = tensor_qtype(new, tuple(ref.shape), outtype)
        planned.append(GGUFTensor(new, qtype, _source(name, ref)))
    return planned


def plan_first_class(
    model: Path, outtype: str | OutType = "f16", audio_tables: str | None = None
) -> FirstClassPlan:
    """Open a MOSS-TTS checkpoint and decide its first-class GGUF; no tensor data is read.

    ``audio_tables``: the quantized files keep the audio tables in this type (f16, bf16, q8_0)
    instead of the base type llama.cpp's quantizer gives them."""
    out_type = OutType.parse(outtype)
    ck = open_checkpoint(Path(model))
    config_path = ck.root / "config.json"
    params = Qwen3Params.from_config(backbone_config(ck), config_path)
    tensors = plan_first_class_tensors(ck, out_type)
    # the converter's SpecialVocab reads <folder>/config.json: the MOSS config itself
    vocab = read_vocab(ck.root, ck.config, params.vocab, byte_level_adds=False)
    merged = hparams(ck.config)
    moss = {key: moss_value(merged, key) for key in MOSS_KEYS}
    plan = FirstClassPlan(params, tensors, vocab, out_type, "", hparams=merged, moss_values=moss)
    plan.audio_tables = parse_audio_tables_type(audio_tables)
    if plan.audio_tables is not None:
        block = gguf.GGML_QUANT_SIZES[plan.audio_tables][0]
        if params.hidden % block:
            raise UsageError(
                f"audio tables of {params.hidden} columns do not split into "
                f"{plan.audio_tables.name} blocks of {block}",
                hint="choose f16 or bf16",
            )
    plan.metadata = model_card(ck.root, plan)
    plan.name = plan.metadata.name or ck.root.name
    return plan


def moss_value(hp: dict[str, Any], key: str) -> Any:
    """A MOSS key's value in the merged config HP (`hparams`)."""
    if hp.get(key) is not None:
        return hp[key]
    # a key the config leaves out: the value the rest of moss-gguf assumes (MossConfig's)
    return getattr(MossConfig.from_dict(hp), key)
