"""The audio codec as the two GGUFs of OpenMOSS's llama.cpp fork: encoder and decoder plans.

The fork's native path runs the MOSS Audio Tokenizer inside llama.cpp from two files, loaded
with ``--audio-encoder-model`` / ``--audio-decoder-model``: architecture
``moss-tts-audio-encoder`` (the encoder modules, the quantizer's input projection and every
quantizer's in/out projection and codebook) and ``moss-tts-audio-decoder`` (the quantizers'
out projections and codebooks, the quantizer's output projection, the decoder modules). Its
converter (``convert_moss_audio_tokenizer_split_to_gguf.py``) is the reference for every byte:
the keys and their order (general.architecture, file_type, type "model", name "<name>
Encoder|Decoder", the codec's rates and quantizer facts, one group of keys per module with the
context a Transformer attends to), the tensor names (a Transformer module's tensors under
``blk.{n}``, n counting Transformer modules only), the order (the checkpoint's, filtered), the
types (f32: all F32; f16: 1-D F32, the rest F16) and weight norm folded as ``g · v / ‖v‖``
in float32 (the norm over all but the first axis, at least float32's eps).
tests/test_audio_codec.py holds the sha256 of the fork converter's own outputs.

The plans over an opened checkpoint, and the one pass that reads each tensor once for both
files, are source/codec_plan.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..errors import UsageError

FORMAT = "moss-tts-audio-codec"
ENCODER_ARCH = "moss-tts-audio-encoder"
DECODER_ARCH = "moss-tts-audio-decoder"
ARCHES = {"encoder": ENCODER_ARCH, "decoder": DECODER_ARCH}
OUTTYPES = ("f16", "f32")
# the fork's defaults for keys a config may lack
DEFAULT_SAMPLING_RATE = 24_000
DEFAULT_DOWNSAMPLE_RATE = 1_920
DEFAULT_CONTEXT_SECONDS = 10.0
# the keys the fork's loader cannot do without (moss_codec_model_meta_u32), under <arch>.
REQUIRED_KEYS = ("sampling_rate", "downsample_rate", "quantizer.num_quantizers")
# Transformer module keys written when the config has them, in the converter's order
MODULE_KEYS = (
    "input_dimension",
    "output_dimension",
    "d_model",
    "num_heads",
    "num_layers",
    "dim_feedforward",
    "causal",
    "norm",
    "positional_embedding",
    "max_period",
    "layer_scale",
    "conv_layout",
    "gating",
)
# a Transformer layer's tensors: upstream name → the fork's
LAYER_NAMES = {
    "layer_scale_1.scale": "attn_scale.scale",
    "layer_scale_2.scale": "ffn_scale.scale",
    "linear1.weight": "ffn_up.weight",
    "linear2.weight": "ffn_down.weight",
    "norm1.weight": "attn_norm.weight",
    "norm1.bias": "attn_norm.bias",
    "norm2.weight": "ffn_norm.weight",
    "norm2.bias": "ffn_norm.bias",
    "self_attn.in_projs.0.weight": "attn_qkv.weight",
    "self_attn.out_projs.0.weight": "attn_output.weight",
}
G, V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class CodecTensor:
    name: str  # in the GGUF
    sources: tuple[str, ...]  # one tensor, or g and v of a weight-normed convolution
    shape: tuple[int, ...]
    qtype: QT

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * (2 if self.qtype == QT.F16 else 4)


@dataclass
class CodecPlan:
    """One of the two GGUFs: its architecture, keys in order, tensors in order."""

    part: str  # "encoder" or "decoder"
    model_name: str  # general.name
    outtype: str
    keys: list[tuple[str, Any, VT]] = field(default_factory=list)
    tensors: list[CodecTensor] = field(default_factory=list)

    @property
    def arch(self) -> str:
        return ARCHES[self.part]

    def file_name(self, stem: str) -> str:
        return f"{stem}-{self.part}-{self.outtype}.gguf"

    def writer(self, path: Path | None) -> gguf.GGUFWriter:
        """A GGUFWriter holding the header: every key and tensor info, data not yet written."""
        w = gguf.GGUFWriter(path=path, arch=self.arch)
        w.add_file_type(
            gguf.LlamaFileType.MOSTLY_F16 if self.outtype == "f16" else gguf.LlamaFileType.ALL_F32
        )
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(self.model_name)
        for key, value, vtype in self.keys:
            w.add_key_value(key, value, vtype)
        for t in self.tensors:
            dtype = np.float16 if t.qtype == QT.F16 else np.float32
            w.add_tensor_info(t.name, t.shape, np.dtype(dtype), t.nbytes)
        return w


def parse_outtype(value: str) -> str:
    v = str(value).lower()
    if v not in OUTTYPES:
        raise UsageError(
            f"--format {FORMAT} writes f16 or f32, not {value!r}",
            hint="the fork's converter has no other type; quantize the files afterwards",
        )
    return v


def _config_value(key: str, value: Any) -> tuple[str, Any, VT]:
    """A config value typed as the converter types it (non-negative ints unsigned)."""
    if isinstance(value, bool):
        return key, value, VT.BOOL
    if isinstance(value, int):
        return key, value, VT.UINT32 if value >= 0 else VT.INT32
    if isinstance(value, float):
        return key, value, VT.FLOAT32
    return key, str(value), VT.STRING


def common_keys(arch: str, config: dict[str, Any]) -> list[tuple[str, Any, VT]]:
    q = dict(config["quantizer_kwargs"])
    kind = config.get("quantizer_type") or q.get("quantizer_type", "rlfq")
    u32 = [
        ("sampling_rate", config.get("sampling_rate", DEFAULT_SAMPLING_RATE)),
        ("downsample_rate", config.get("downsample_rate", DEFAULT_DOWNSAMPLE_RATE)),
    ]
    seconds = float(config.get("causal_transformer_context_duration", DEFAULT_CONTEXT_SECONDS))
    keys = [(f"{arch}.{k}", int(v), VT.UINT32) for k, v in u32]
    keys.append((f"{arch}.causal_transformer_context_duration", seconds, VT.FLOAT32))
    keys.append(
        (f"{arch}.code_dim", int(config.get("code_dim", q.get("output_dim", 0))), VT.UINT32)
    )
    keys.append((f"{arch}.quantizer_type", kind, VT.STRING))
    dims = [
        ("input_dim", q["input_dim"]),
        ("rvq_dim", q.get("rvq_dim", q["input_dim"])),
        ("output_dim", q.get("output_dim", q["input_dim"])),
        ("num_quantizers", q["num_quantizers"]),
        ("codebook_size", q["codebook_size"]),
        ("codebook_dim", q["codebook_dim"]),
    ]
    keys += [(f"{arch}.quantizer.{k}", int(v), VT.UINT32) for k, v in dims]
    return keys


def module_keys(arch: str, part: str, config: dict[str, Any]) -> list[tuple[str, Any, VT]]:
    """block_count, then each module's type and facts; a Transformer's attention context in
    frames at the rate it runs at (the encoder divides the rate by each patch, the decoder,
    starting from the encoder's final rate, multiplies it back)."""
    modules = config[f"{part}_kwargs"]
    seconds = float(config.get("causal_transformer_context_duration", DEFAULT_CONTEXT_SECONDS))
    rate = float(config.get("sampling_rate", DEFAULT_SAMPLING_RATE))
    if part == "decoder":
        for m in config["encoder_kwargs"]:
            if m["module_type"] == "PatchedPretransform":
                rate /= int(m["patch_size"])
    keys = [(f"{arch}.{part}.block_count", len(modules), VT.UINT32)]
    for i, m in enumerate(modules):
        prefix = f"{arch}.{part}.{i}"
        keys.append((f"{prefix}.module_type", m["module_type"], VT.STRING))
        if m["module_type"] == "PatchedPretransform":
            patch = int(m["patch_size"])
            keys.append((f"{prefix}.patch_size", patch, VT.UINT32))
            rate = rate / patch if part == "encoder" else rate * patch
            continue
        keys.append(_config_value(f"{prefix}.context", int(rate * seconds)))
        keys += [_config_value(f"{prefix}.{k}", m[k]) for k in MODULE_KEYS if k in m]
    return keys


def blocks_of(modules: list[dict[str, Any]]) -> dict[int, int]:
    """Module index → block number, counting Transformer modules only."""
    idx = [i for i, m in enumerate(modules) if m["module_type"] == "Transformer"]
    return {i: n for n, i in enumerate(idx)}


def gguf_name(name: str, blocks: dict[str, dict[int, int]]) -> str | None:
    """A checkpoint tensor's name in the codec GGUFs (None: the converter leaves it out);
    a weight-normed convolution is named by its g, as ``.weight``."""
    if V in name:
        return None
    base = name.replace(G, ".weight")
    section, _, rest = base.partition(".")
    if section not in blocks:
        return base
    index, _, tail = rest.partition(".")
    block = blocks[section].get(int(index)) if index.isdigit() else None
    if block is None:
        return None
    if tail in ("input_proj.weight", "output_proj.weight"):
        return f"blk.{block}.{tail}"
    parts = tail.split(".")
    if len(parts) < 5 or parts[:2] != ["transformer", "layers"] or not parts[2].isdigit():
        return None
    short = LAYER_NAMES.get(".".join(parts[3:]))
    return f"blk.{block}.layer.{int(parts[2])}.{short}" if short else None


def in_part(base: str, part: str) -> bool:
    """Whether a tensor (by its checkpoint name, g named .weight) goes into PART's file."""
    if base.startswith(f"{part}."):
        return True
    own = "quantizer.input_proj." if part == "encoder" else "quantizer.output_proj."
    if base.startswith(own):
        return True
    inner = (
        (".in_proj.", ".out_proj.", ".codebook.")
        if part == "encoder"
        else (".out_proj.", ".codebook.")
    )
    return base.startswith("quantizer.quantizers.") and any(s in base for s in inner)


def fold_weight_norm(g: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Weight norm folded as the fork folds it: g · v / max(‖v‖, eps), float32, ‖·‖ over
    every axis but the first."""
    v = v.astype(np.float32)
    norm = np.linalg.norm(v, axis=tuple(range(1, v.ndim)), keepdims=True)
    norm = np.maximum(norm, np.finfo(np.float32).eps)
    return g.astype(np.float32) * v / norm
