"""The first-class `moss-tts-delay` GGUF that OpenMOSS's llama.cpp fork runs: plan and header.

One file holds the Qwen3 backbone, the text embedding, n_vq audio embeddings, the text head
and n_vq audio heads; the fork's `llama-moss-tts` does the multi-channel embedding, the heads
and the delay pattern inside llama.cpp. The reference for every decision here is the fork's
own converter (`convert_hf_to_gguf.py`, class MossTTSDelayModel), and the tests hold the
sha256 of its outputs (docs/ARCHITECTURE.md §4):

- the Qwen3 hyperparameters are read from `language_config`, lifted over the top-level keys;
- the MOSS keys (`moss-tts-delay.n_vq`, ...) follow `general.file_type`;
- `language_model.X` gets its Qwen3 GGUF name, `emb_ext.i` → `token_embd_audio.i.weight`,
  `lm_heads.0` → `output.weight`, `lm_heads.k` → `output_audio.{k-1}.weight`;
- the tensors come in the converter's order: shard after shard (file names sorted), names
  sorted within a shard;
- `general.*` come from the gguf package's own model-card heuristics on the source folder.

The stock llama.cpp does not know the architecture, so llama.cpp's quantizer is asked about
a qwen3 stand-in with the same tensors (`DelayPlan.dry_run_plan`); the fork's quantizer has
no rule of its own for the audio tensors, and the tests compare its bytes with ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..errors import InputError, UnsupportedModelError, UsageError
from ..source.backbone import backbone_config
from ..source.checkpoint import MossCheckpoint, open_checkpoint
from .stream import SOURCE_DTYPES, GGUFTensor, SourceTensor
from .vocab import read_vocab
from .write import GGUFPlan, OutType, Qwen3Params, tensor_qtype

ARCH_NAME = "moss-tts-delay"
FORMAT = ARCH_NAME  # the --format value
AUDIO_EMBD = "token_embd_audio"
AUDIO_HEAD = "output_audio"
# the MOSS keys the converter writes after general.file_type, in its order
MOSS_KEYS = (
    "n_vq",
    "audio_vocab_size",
    "audio_pad_code",
    "audio_start_token_id",
    "audio_end_token_id",
    "audio_user_slot_token_id",
    "audio_assistant_gen_slot_token_id",
    "audio_assistant_delay_slot_token_id",
)
_CONTEXT_KEYS = (
    "max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
    "model_max_length",
)  # fmt: skip
_EMB = re.compile(r"emb_ext\.(\d+)\.weight")
_HEAD = re.compile(r"lm_heads\.(\d+)\.weight")


def gguf_name(name: str, names: gguf.TensorNameMap) -> str | None:
    """The first-class GGUF name of a MOSS checkpoint tensor (None: not one the format has)."""
    if m := _EMB.fullmatch(name):
        return f"{AUDIO_EMBD}.{int(m[1])}.weight"
    if m := _HEAD.fullmatch(name):
        k = int(m[1])
        return "output.weight" if k == 0 else f"{AUDIO_HEAD}.{k - 1}.weight"
    if name.startswith("language_model."):
        return names.get_name("model." + name[len("language_model.") :], (".weight", ".bias"))
    return None


def hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The config as the fork's converter sees it: language_config over the top level."""
    language = config.get("language_config") or {}
    lifted = {k: v for k, v in language.items() if k not in ("architectures", "model_type")}
    return {**config, **lifted}


@dataclass
class DelayPlan(GGUFPlan):
    """A first-class GGUF: the Qwen3 plan's parts plus the merged config and the model card."""

    hparams: dict[str, Any] | None = None
    metadata: gguf.Metadata | None = None
    audio_tables: gguf.GGMLQuantizationType | None = None  # over the quantizer's choice

    def forced_type(self, name: str) -> gguf.GGMLQuantizationType | None:
        return self.audio_tables if name.startswith((AUDIO_EMBD, AUDIO_HEAD)) else None

    def writer(self) -> gguf.GGUFWriter:
        return build_delay_writer(self)

    def dry_run_plan(self) -> GGUFPlan:
        """The same tensors under a qwen3 header: what the stock llama.cpp can plan."""
        return GGUFPlan(self.params, self.tensors, self.vocab, self.outtype, self.name)


def _source(name: str, ref: Any) -> SourceTensor:
    return SourceTensor(name, ref.path, ref.dtype, tuple(ref.shape), ref.offset, ref.nbytes)


def plan_tensors(ck: MossCheckpoint, outtype: OutType) -> list[GGUFTensor]:
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


AUDIO_TABLE_TYPES = ("f16", "bf16", "q8_0")


def parse_audio_tables_type(value: str | None) -> gguf.GGMLQuantizationType | None:
    """--audio-tables-type: None (the quantizer's choice: the file's base type) or a type."""
    if value is None:
        return None
    v = value.strip().lower()
    if v not in AUDIO_TABLE_TYPES:
        raise UsageError(
            f"unknown audio tables type {value!r}", hint="choose " + ", ".join(AUDIO_TABLE_TYPES)
        )
    return gguf.GGMLQuantizationType[v.upper()]


def plan_delay(
    model: Path, outtype: str | OutType = "f16", audio_tables: str | None = None
) -> DelayPlan:
    """Open a MOSS-TTS checkpoint and decide its first-class GGUF; no tensor data is read.

    ``audio_tables``: the quantized files keep the audio tables in this type (f16, bf16, q8_0)
    instead of the base type llama.cpp's quantizer gives them."""
    out_type = OutType.parse(outtype)
    ck = open_checkpoint(Path(model))
    config_path = ck.root / "config.json"
    params = Qwen3Params.from_config(backbone_config(ck), config_path)
    tensors = plan_tensors(ck, out_type)
    # the converter's SpecialVocab reads <folder>/config.json: the MOSS config itself
    vocab = read_vocab(ck.root, ck.config, params.vocab, byte_level_adds=False)
    merged = hparams(ck.config)
    plan = DelayPlan(params, tensors, vocab, out_type, "", hparams=merged)
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


def _tensor_writer(plan: GGUFPlan) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(path=None, arch=ARCH_NAME)
    for t in plan.tensors:
        # logical shape + a non-uint8 dtype: GGUFWriter takes the shape as is
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    return w


def model_card(root: Path, plan: GGUFPlan) -> gguf.Metadata:
    """general.* as the converter derives them: gguf's heuristics on the folder, its README
    and config, the folder's name when nothing names the model, the size from the tensors."""
    total, shared, expert, count = _tensor_writer(plan).get_total_parameter_count()
    meta = gguf.Metadata.load(None, root, None, total)
    if meta.name is None:
        meta.name = root.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, count)
    return meta


def build_delay_writer(plan: DelayPlan) -> gguf.GGUFWriter:
    """A GGUFWriter holding every key/value and tensor info, in the fork converter's order."""
    hp = plan.hparams or {}
    w = _tensor_writer(plan)
    w.add_type(gguf.GGUFType.MODEL)
    plan.metadata.set_gguf_meta_model(w)
    _add_backbone_keys(w, hp, plan.params, plan.outtype)
    for key in MOSS_KEYS:
        w.add_uint32(f"{ARCH_NAME}.{key}", int(moss_value(hp, key)))
    if hp.get("sampling_rate") is not None:
        w.add_uint32(f"{ARCH_NAME}.sampling_rate", int(hp["sampling_rate"]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    plan.vocab.add_to(w)
    return w


def moss_value(hp: dict[str, Any], key: str) -> Any:
    from ..source.checkpoint import MossConfig

    if hp.get(key) is not None:
        return hp[key]
    # a key the config leaves out: the value the rest of moss-gguf assumes (MossConfig's)
    return getattr(MossConfig.from_dict(hp), key)


def _first(hp: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((hp[k] for k in keys if k in hp), None)


def _add_backbone_keys(w: gguf.GGUFWriter, hp: dict[str, Any], p: Qwen3Params, out: OutType):
    """The Qwen3 keys, written only where the config has them (as the converter writes)."""
    w.add_block_count(p.n_layers)
    if (n_ctx := _first(hp, _CONTEXT_KEYS)) is not None:
        w.add_context_length(n_ctx)
    w.add_embedding_length(p.hidden)
    w.add_feed_forward_length(p.ff)
    w.add_head_count(p.heads)
    if (kv := hp.get("num_key_value_heads")) is not None:
        w.add_head_count_kv(kv)
    if (theta := _rope_theta(hp)) is not None:
        w.add_rope_freq_base(theta)
    if (eps := _first(hp, ("rms_norm_eps", "norm_eps"))) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (head_dim := hp.get("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(out.file_type)


def _rope_theta(hp: dict[str, Any]) -> float | None:
    rope = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        return rope["rope_theta"]
    return _first(hp, ("global_rope_theta", "rope_global_theta", "rope_theta_global",
                       "rope_theta", "rotary_emb_base"))  # fmt: skip
