"""llama.cpp's LoRA adapter GGUF (docs/lora.md): the header, the tensor types, our base identity.

The file is the one llama.cpp's `convert_lora_to_gguf.py` writes (`general.type adapter`,
`adapter.type lora`, `adapter.lora.alpha`, tensors `<base name>.lora_a` / `.lora_b` in the
out type, Q8_0 falling back to F16 where a row is not whole blocks), plus keys naming the base
it was made for: llama.cpp checks only the architecture and shapes, and a MOSS adapter also
fits another MOSS release of the same dims.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .read import GgufFile

QT = gguf.GGMLQuantizationType
ARCH = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3]
OUTTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}
# the base's identity: ours, beside llama.cpp's adapter keys (it ignores keys it does not know)
KEY_BASE_MODEL = "adapter.moss_gguf.base.model"  # repo@commit, a builtin name, or ""
KEY_BASE_DIGEST = "adapter.moss_gguf.base.digest"
KEY_BASE_HPARAMS = "adapter.moss_gguf.base.hparams"  # JSON
# which base tensor the digest is of: the first audio head, rounded to f16 as the backend
# folder's lm_heads/lm_head_audio_00.npy holds it, so any folder of any file type can check it
DIGEST_TENSOR = "lm_heads.1.weight"


@dataclass(frozen=True)
class BaseIdentity:
    """The base an adapter GGUF was made for."""

    model: str  # "" when only a local folder was known
    digest: str  # "sha256:" of DIGEST_TENSOR in f16
    hparams: dict[str, int]  # the backbone's dims as the GGUF names them, and n_vq


@dataclass(frozen=True)
class LoraTensor:
    """One tensor of the adapter file, float32 as it will be rounded."""

    name: str
    data: np.ndarray


def table_digest(table: np.ndarray) -> str:
    """The digest of one base table (any float dtype) as its f16 rounding."""
    data = np.ascontiguousarray(table, dtype=np.float16)
    return "sha256:" + hashlib.sha256(data.tobytes()).hexdigest()


def backbone_hparams(g: GgufFile, n_vq: int) -> dict[str, int]:
    """A backbone GGUF's dims under the names the adapter file records."""
    arch = g.arch or ARCH
    names = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
             "attention.head_count_kv", "attention.key_length")  # fmt: skip
    out = {n: int(g.kv[f"{arch}.{n}"]) for n in names if isinstance(g.kv.get(f"{arch}.{n}"), int)}
    return {**out, "n_vq": int(n_vq)}


def config_hparams(language_config: dict[str, Any], n_vq: int) -> dict[str, int]:
    """The same dims from a MOSS config's language_config (what the converter knows)."""
    c = language_config
    heads = int(c["num_attention_heads"])
    return {
        "block_count": int(c["num_hidden_layers"]),
        "embedding_length": int(c["hidden_size"]),
        "feed_forward_length": int(c["intermediate_size"]),
        "attention.head_count": heads,
        "attention.head_count_kv": int(c.get("num_key_value_heads", heads)),
        "attention.key_length": int(c.get("head_dim") or c["hidden_size"] // heads),
        "n_vq": int(n_vq),
    }


def read_identity(g: GgufFile) -> BaseIdentity | None:
    """The base identity an adapter file records; None for a file written without it (by
    llama.cpp's converter)."""
    digest, hparams = g.kv.get(KEY_BASE_DIGEST), g.kv.get(KEY_BASE_HPARAMS)
    if not isinstance(digest, str) or not isinstance(hparams, str):
        return None
    try:
        dims = json.loads(hparams)
    except (ValueError, RecursionError):
        dims = {}
    model = g.kv.get(KEY_BASE_MODEL)
    return BaseIdentity(model if isinstance(model, str) else "", digest, dims)


def tensor_qtype(data: np.ndarray, outtype: str) -> tuple[QT, np.ndarray]:
    """The type llama.cpp's converter gives DATA under OUTTYPE, and DATA in it."""
    qtype = OUTTYPES[outtype]
    if qtype == QT.F32:
        return qtype, np.ascontiguousarray(data, np.float32)
    try:
        return qtype, gguf.quants.quantize(data, qtype)
    except gguf.QuantError:  # Q8_0 needs whole 32-value blocks: the rank's rows fall back
        return QT.F16, gguf.quants.quantize(data, QT.F16)


def write_lora_gguf(path: Path, tensors: list[LoraTensor], alpha: float, outtype: str,
                    identity: BaseIdentity) -> int:  # fmt: skip
    """The adapter file at PATH (the caller's temporary name); returns its size."""
    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_string(KEY_BASE_MODEL, identity.model)
    writer.add_string(KEY_BASE_DIGEST, identity.digest)
    writer.add_string(KEY_BASE_HPARAMS, json.dumps(identity.hparams, sort_keys=True))
    for t in tensors:
        qtype, data = tensor_qtype(t.data, outtype)
        writer.add_tensor(t.name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path).stat().st_size
