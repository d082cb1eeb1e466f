"""Native Qwen3 → GGUF writer: the plan (hyperparameters, tensor names and types) and the header.

llama.cpp's ``convert_hf_to_gguf.py`` (the pinned tree) is the reference for every decision
made here: which keys, which tokenizer facts, which type each tensor gets. What it decides
through transformers and torch we decide from the same files with ``tokenizers`` and NumPy;
the parity tests compare both outputs tensor by tensor and key by key.

The tokenizer keys come from gguf/vocab.py, the tensor data from gguf/stream.py. Memory stays
bounded: GGUFWriter writes the header, the key/values and the tensor infos (for which it needs
only shapes, types and sizes); the data is then streamed in row chunks. The output is
preallocated and written through the page cache with write-behind (disk.sinks.WriteBehindSink):
quantize reads it next from memory, while dirty pages stay bounded so the writer is never
throttled.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..disk.page_cache import SourcePages
from ..disk.sinks import appender
from ..errors import InputError, UnsupportedModelError, UsageError
from ..progress import ProgressReporter, ensure
from .qwen3_names import layer_shapes
from .stream import SOURCE_DTYPES, GGUFTensor, SourceTensor, write_tensor_data
from .vocab import ENGINE_HINT, Vocab

ARCH = gguf.MODEL_ARCH.QWEN3
ARCH_NAME = gguf.MODEL_ARCH_NAMES[ARCH]
QT = gguf.GGMLQuantizationType

# transformers' Qwen3Config defaults: llama.cpp reads the config through AutoConfig, so a key
# missing from config.json takes these values there.
QWEN3_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 32,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)


class OutType(str, Enum):
    """GGUF out types, named as convert_hf_to_gguf.py's --outtype."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    Q8_0 = "q8_0"

    @property
    def qtype(self) -> gguf.GGMLQuantizationType:
        return {"f16": QT.F16, "bf16": QT.BF16, "f32": QT.F32, "q8_0": QT.Q8_0}[self.value]

    @property
    def file_type(self) -> gguf.LlamaFileType:
        return {
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16,
            "f32": gguf.LlamaFileType.ALL_F32,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[self.value]

    @classmethod
    def parse(cls, value: str | OutType) -> OutType:
        try:
            return cls(str(getattr(value, "value", value)).lower())
        except ValueError:
            raise UsageError(
                f"unknown out type {value!r}",
                hint="choose one of " + ", ".join(t.value for t in cls),
            ) from None


# --------------------------------------------------------------------------- hyperparameters


@dataclass(frozen=True)
class Qwen3Params:
    n_layers: int
    hidden: int
    ff: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rms_eps: float
    rope_theta: float
    tied: bool

    @classmethod
    def from_config(cls, config: dict[str, Any], path: Path | None = None) -> Qwen3Params:
        """Read a Qwen3ForCausalLM config the way llama.cpp's converter sees it."""
        missing = [k for k in _REQUIRED if config.get(k) is None]
        if missing:
            raise InputError(f"config is missing {missing[0]}", path=path)
        if config.get("attention_bias"):
            raise UnsupportedModelError(
                "attention_bias = true (q/k/v/o biases) is not handled by the native engine",
                path=path,
                hint=ENGINE_HINT,
            )
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
        if rope_type not in (None, "default"):
            raise UnsupportedModelError(
                f"RoPE scaling {rope_type!r} is not handled by the native engine",
                path=path,
                hint=ENGINE_HINT,
            )

        def get(key: str) -> Any:
            value = config.get(key)
            return QWEN3_DEFAULTS[key] if value is None and key in QWEN3_DEFAULTS else value

        theta = config.get("rope_theta")
        if theta is None and isinstance(rope, dict):
            theta = rope.get("rope_theta")
        heads = int(config["num_attention_heads"])
        kv = config.get("num_key_value_heads", QWEN3_DEFAULTS["num_key_value_heads"])
        try:
            return cls(
                n_layers=int(config["num_hidden_layers"]),
                hidden=int(config["hidden_size"]),
                ff=int(config["intermediate_size"]),
                heads=heads,
                kv_heads=heads if kv is None else int(kv),
                head_dim=int(get("head_dim")),
                vocab=int(config["vocab_size"]),
                context=int(get("max_position_embeddings")),
                rms_eps=float(get("rms_norm_eps")),
                rope_theta=float(QWEN3_DEFAULTS["rope_theta"] if theta is None else theta),
                tied=bool(get("tie_word_embeddings")),
            )
        except (TypeError, ValueError) as exc:
            raise InputError(f"config has a value of the wrong type ({exc})", path=path) from exc


def expected_shapes(hp: Qwen3Params) -> dict[str, tuple[int, ...]]:
    """Qwen3ForCausalLM tensor names (Hugging Face) → shapes the config implies."""
    h, q, kv = hp.hidden, hp.heads * hp.head_dim, hp.kv_heads * hp.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (hp.vocab, h)}
    for n in range(hp.n_layers):
        shapes.update(layer_shapes(f"model.layers.{n}.", h, q, kv, hp.ff, hp.head_dim))
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (hp.vocab, h)
    return shapes


# --------------------------------------------------------------------------- tensors


def tensor_qtype(gguf_name: str, shape: tuple[int, ...], outtype: OutType) -> QT:
    """The type llama.cpp's converter gives this tensor for this out type."""
    # 1-D tensors and norms stay f32: ggml's norm kernels take f32 weights
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight"):
        return QT.F32
    if not gguf_name.endswith(".weight"):
        return QT.F32
    qtype = outtype.qtype
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        return QT.F16  # the converter falls back to f16 when rows do not split into blocks
    return qtype


def block_order(name: str) -> tuple[int, int, int, str]:
    """Order: token_embd, blocks by number (tensors in forward order), output_norm, output."""
    parts = name.split(".")
    if parts[0] == "blk":
        kind = parts[2]
        rank = _BLOCK_TENSORS.index(kind) if kind in _BLOCK_TENSORS else len(_BLOCK_TENSORS)
        return (1, int(parts[1]), rank, name)
    return ({"token_embd": 0, "output_norm": 2, "output": 3}.get(parts[0], 4), 0, 0, name)


_BLOCK_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_q_norm",
    "attn_k",
    "attn_k_norm",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


def plan_backbone_tensors(
    hp: Qwen3Params,
    sources: dict[str, SourceTensor],
    outtype: OutType,
    where: Path | None = None,
) -> list[GGUFTensor]:
    """Check the tensor set against the config and give each its GGUF name and type."""
    expected = expected_shapes(hp)
    if hp.tied and "lm_head.weight" not in sources:
        del expected["lm_head.weight"]  # tied: llama.cpp reuses token_embd as the output
    for name, shape in expected.items():
        src = sources.get(name)
        if src is None:
            raise InputError(
                f"tensor {name!r} is missing",
                path=where,
                hint="the checkpoint is incomplete or not a Qwen3 backbone",
            )
        if tuple(src.shape) != shape:
            raise InputError(
                f"tensor {name!r} has shape {list(src.shape)} but the config implies {list(shape)}",
                path=src.path,
                hint="config.json and the weights disagree",
            )
        if src.dtype not in SOURCE_DTYPES:
            raise InputError(
                f"tensor {name!r} has dtype {src.dtype}; expected BF16, F16 or F32",
                path=src.path,
            )
    extra = [
        n for n in sources if n not in expected and not n.endswith(".rotary_emb.inv_freq")
    ]  # the converter drops inv_freq buffers: they are recomputed from rope_theta
    if extra:
        raise InputError(
            f"unexpected tensor {extra[0]!r} ({len(extra)} in all) for a "
            f"{hp.n_layers}-layer Qwen3 config",
            path=sources[extra[0]].path,
            hint="config.json and the weights disagree, or this is not a plain Qwen3 backbone",
        )
    names = gguf.get_tensor_name_map(ARCH, hp.n_layers)
    planned = []
    for hf_name in expected:
        new = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new is None:  # every expected name maps; this would be a gguf package change
            raise UnsupportedModelError(f"no GGUF name for tensor {hf_name!r}", hint=ENGINE_HINT)
        src = sources[hf_name]
        planned.append(GGUFTensor(new, tensor_qtype(new, src.shape, outtype), src))
    planned.sort(key=lambda t: block_order(t.name))
    return planned


# --------------------------------------------------------------------------- writing


@dataclass
class GGUFPlan:
    """Everything a GGUF needs, decided and checked before a byte is written."""

    params: Qwen3Params
    tensors: list[GGUFTensor]
    vocab: Vocab
    outtype: OutType
    name: str

    @property
    def source_bytes(self) -> int:
        return sum(t.source.nbytes for t in self.tensors)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def writer(self) -> gguf.GGUFWriter:
        """The header's writer (a dialect of the format overrides it)."""
        return build_writer(self)

    def forced_type(self, name: str) -> QT | None:
        """A type the user chose for this tensor over llama.cpp's choice (None: its choice)."""
        return None

    def file_type(self) -> int:
        """general.file_type (a plan over tensors already typed says theirs)."""
        return self.outtype.file_type

    def dry_run_plan(self) -> GGUFPlan:
        """The plan llama.cpp's quantizer is asked about: this one, unless the architecture
        is one the stock llama.cpp does not know."""
        return self


def build_writer(plan: GGUFPlan) -> gguf.GGUFWriter:
    """A GGUFWriter holding every key/value and tensor info, in llama.cpp's order."""
    hp = plan.params
    w = gguf.GGUFWriter(path=None, arch=ARCH_NAME)
    total = sum(math.prod(t.shape) for t in plan.tensors)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(plan.name)
    w.add_size_label(gguf.size_label(total, total, 0, 0))
    w.add_block_count(hp.n_layers)
    w.add_context_length(hp.context)
    w.add_embedding_length(hp.hidden)
    w.add_feed_forward_length(hp.ff)
    w.add_head_count(hp.heads)
    w.add_head_count_kv(hp.kv_heads)
    w.add_rope_freq_base(hp.rope_theta)
    w.add_layer_norm_rms_eps(hp.rms_eps)
    w.add_key_length(hp.head_dim)
    w.add_value_length(hp.head_dim)
    w.add_file_type(plan.file_type())
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    plan.vocab.add_to(w)
    for t in plan.tensors:
        # logical shape + a non-uint8 dtype: GGUFWriter takes the shape as is
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    return w


def write_header(path: Path, plan: GGUFPlan) -> tuple[int, int, int]:
    """Write the plan's header (key/values and tensor infos) to a new file at path.

    Returns (header bytes, data alignment, the size the whole file will have)."""
    writer = plan.writer()
    writer.write_header_to_file(path=Path(path))
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    alignment = writer.data_alignment
    writer.close()
    header = Path(path).stat().st_size
    data_start = header + (-header % alignment)
    size = data_start + sum(t.nbytes + (-t.nbytes % alignment) for t in plan.tensors)
    return header, alignment, size


def write_gguf(
    path: Path,
    plan: GGUFPlan,
    progress: ProgressReporter | None = None,
    pages: SourcePages | None = None,
) -> int:
    """Write the plan to path (which the caller renames into place); returns its size.

    With ``pages``, each source range is reported as read (`all` drops it from the page
    cache once every reader is past it).
    """
    bar = ensure(progress)
    header, alignment, size = write_header(path, plan)

    bar.start("convert:bytes", "convert", plan.source_bytes, "B")
    bar.start("convert:tensors", "tensors", len(plan.tensors), "")
    with open(path, "r+b") as out:
        out.seek(header)
        # kept in the page cache: quantize (or a first run) reads the GGUF next
        with appender(out, Path(path), header, size, keep_cached=True) as sink:
            write_tensor_data(
                sink,
                plan.tensors,
                alignment,
                on_tensor=lambda t, finished: bar.advance(
                    "convert:tensors", 1 if finished else 0, description=t.name
                ),
                on_bytes=lambda n: bar.advance("convert:bytes", n),
                pages=pages,
            )
        if sink.tell() != size or os.fstat(out.fileno()).st_size != size:
            raise AssertionError(f"wrote {sink.tell()} bytes, planned {size}")
    bar.finish("convert:tensors")
    bar.finish("convert:bytes")
    return size
