"""The first-class `moss-tts-delay` GGUF that OpenMOSS's llama.cpp fork runs: its facts and header.

One file holds the Qwen3 backbone, the text embedding, n_vq audio embeddings, the text head
and n_vq audio heads; the fork's `llama-moss-tts` does the multi-channel embedding, the heads
and the delay pattern inside llama.cpp. The reference for every decision here is the fork's
own converter (`convert_hf_to_gguf.py`, class MossTTSDelayModel), and the tests hold the
sha256 of its outputs (docs/ARCHITECTURE.md §4). A checkpoint is planned into one by
source/first_class.py:

- the Qwen3 hyperparameters are read from `language_config`, lifted over the top-level keys;
- the MOSS keys (`moss-tts-delay.n_vq`, ...) follow `general.file_type`;
- `language_model.X` gets its Qwen3 GGUF name, `emb_ext.i` → `token_embd_audio.i.weight`,
  `lm_heads.0` → `output.weight`, `lm_heads.k` → `output_audio.{k-1}.weight`;
- the tensors come in the converter's order: shard after shard (file names sorted), names
  sorted within a shard;
- `general.*` come from the gguf package's own model-card heuristics on the source folder.

The stock llama.cpp does not know the architecture, so llama.cpp's quantizer is asked about
a qwen3 stand-in with the same tensors (`FirstClassPlan.dry_run_plan`); the fork's quantizer has
no rule of its own for the audio tensors, and the tests compare its bytes with ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..errors import UsageError
from .write import GGUFPlan, OutType, Qwen3Params

ARCH_NAME = "moss-tts-delay"
FORMAT = ARCH_NAME  # the --format value
FILE_STEM = ARCH_NAME  # the files' names: moss-tts-delay_q4_k_m.gguf, moss-tts-delay_f16.gguf
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
class FirstClassPlan(GGUFPlan):
    """A first-class GGUF: the Qwen3 plan's parts plus the merged config, the MOSS keys' values
    and the model card (planned from a checkpoint by source/first_class.py)."""

    hparams: dict[str, Any] | None = None
    moss_values: dict[str, int] | None = None  # MOSS_KEYS: the config's, or their defaults
    metadata: gguf.Metadata | None = None
    audio_tables: gguf.GGMLQuantizationType | None = None  # over the quantizer's choice

    def forced_type(self, name: str) -> gguf.GGMLQuantizationType | None:
        return self.audio_tables if name.startswith((AUDIO_EMBD, AUDIO_HEAD)) else None

    def writer(self) -> gguf.GGUFWriter:
        return build_first_class_writer(self)

    def dry_run_plan(self) -> GGUFPlan:
        """The same tensors under a qwen3 header: what the stock llama.cpp can plan."""
        return GGUFPlan(self.params, self.tensors, self.vocab, self.outtype, self.name)


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


def build_first_class_writer(plan: FirstClassPlan) -> gguf.GGUFWriter:
    """A GGUFWriter holding every key/value and tensor info, in the fork converter's order."""
    hp = plan.hparams or {}
    w = _tensor_writer(plan)
    w.add_type(gguf.GGUFType.MODEL)
    plan.metadata.set_gguf_meta_model(w)
    _add_backbone_keys(w, hp, plan.params, plan.outtype)
    for key in MOSS_KEYS:
        w.add_uint32(f"{ARCH_NAME}.{key}", int(plan.moss_values[key]))
    if hp.get("sampling_rate") is not None:
        w.add_uint32(f"{ARCH_NAME}.sampling_rate", int(hp["sampling_rate"]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    plan.vocab.add_to(w)
    return w


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
