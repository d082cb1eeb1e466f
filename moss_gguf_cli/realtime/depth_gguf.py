"""MOSS-TTS-Realtime's depth side as one GGUF of our own architecture, `moss-tts-realtime-depth`:
everything a frame reads besides the backbone.

    audio_embd.{1..rvq}.weight     [audio_vocab, hidden]  the backbone's input tables, codebook q
                                   (upstream's embed_tokens.q): a row's embedding is the text
                                   row + Σ_q audio_embd.q[c_q]
    blk.{i}.*                      the depth transformer's Qwen3 layers, llama.cpp's names
    output_norm.weight             its final RMSNorm (local_transformer.model.norm)
    depth_embd.{0..rvq-2}.weight   the depth inputs: position i + 1 reads depth_embd.i[c_i]
    depth_head.{0..rvq-1}.weight   position q's head: the logits of code q

The depth transformer is four Qwen3 layers run once a position, sixteen positions a frame, so
a frame reads it sixteen times: its matrices take the file type's own ggml type (Q8_0 for
Q8_0, Q4_K for Q4_K_M, …) through ggml's quantizer (what llama-quantize runs); vectors stay
F32 (ggml's norm kernels take F32), and a row that does not split into the type's blocks
(the tiny model's 64-wide rows under a K-quant) is written F16, as llama.cpp's converter does.
Written one tensor at a time: memory stays at one tensor's float32 rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..errors import InputError, UsageError
from ..native import libggml
from ..progress import ProgressReporter, ensure
from .checkpoint import RealtimeCheckpoint
from .config import TITLE, QwenDims

ARCH = "moss-tts-realtime-depth"
QT = gguf.GGMLQuantizationType
# a file type's matrices, as llama.cpp's file type names them (its dominant ggml type)
MATRIX_TYPES: dict[str, QT] = {
    "F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16, "Q8_0": QT.Q8_0, "Q6_K": QT.Q6_K,
    "Q5_K_M": QT.Q5_K, "Q5_K_S": QT.Q5_K, "Q5_0": QT.Q5_0, "Q5_1": QT.Q5_1,
    "Q4_K_M": QT.Q4_K, "Q4_K_S": QT.Q4_K, "Q4_0": QT.Q4_0, "Q4_1": QT.Q4_1,
}  # fmt: skip
# upstream's per-layer names → llama.cpp's (the order llama.cpp writes a block in)
_LAYER = (
    ("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"),
    ("self_attn.q_norm", "attn_q_norm"), ("self_attn.k_proj", "attn_k"),
    ("self_attn.k_norm", "attn_k_norm"), ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"), ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
)  # fmt: skip


def matrix_type(file_type: str) -> QT:
    """The ggml type of FILE_TYPE's matrices; one line for a type the depth GGUF has no rule for."""
    kind = MATRIX_TYPES.get(file_type)
    if kind is None:
        raise UsageError(f"--file-type {file_type} has no rule for {TITLE}'s depth transformer",
                         hint="choose one of " + ", ".join(MATRIX_TYPES))  # fmt: skip
    return kind


def tensor_type(shape: tuple[int, ...], kind: QT) -> QT:
    if len(shape) == 1:
        return QT.F32
    block = gguf.GGML_QUANT_SIZES[kind][0]
    return kind if shape[-1] % block == 0 else QT.F16


@dataclass(frozen=True)
class DepthTensor:
    name: str  # the GGUF's
    source: str  # the checkpoint's
    shape: tuple[int, ...]  # rows first, as the checkpoint holds it
    qtype: QT

    @property
    def nbytes(self) -> int:
        if len(self.shape) == 1:
            return 4 * self.shape[0]
        return self.shape[0] * libggml.row_size(int(self.qtype), self.shape[1])


def depth_names(rvq: int, layers: int) -> list[tuple[str, str]]:
    """(GGUF name, checkpoint name) of every tensor the depth GGUF holds, in its order."""
    names = [(f"audio_embd.{q}.weight", f"embed_tokens.{q}.weight") for q in range(1, rvq + 1)]
    local = "local_transformer.model."
    for i in range(layers):
        names += [(f"blk.{i}.{ours}.weight", f"{local}layers.{i}.{theirs}.weight")
                  for theirs, ours in _LAYER]  # fmt: skip
    names.append(("output_norm.weight", f"{local}norm.weight"))
    names += [(f"depth_embd.{q}.weight", f"{local}embed_tokens.{q}.weight")
              for q in range(rvq - 1)]  # fmt: skip
    names += [(f"depth_head.{q}.weight", f"local_transformer.local_lm_heads.{q}.weight")
              for q in range(rvq)]  # fmt: skip
    return names


def plan_depth(checkpoint: RealtimeCheckpoint, file_type: str) -> list[DepthTensor]:
    kind = matrix_type(file_type)
    rt = checkpoint.realtime
    return [DepthTensor(name, source, shape, tensor_type(shape, kind))
            for name, source in depth_names(rt.rvq, rt.depth.layers)
            for shape in [tuple(checkpoint.tensors[source].shape)]]  # fmt: skip


def _add_keys(w: gguf.GGUFWriter, checkpoint: RealtimeCheckpoint, file_type: str) -> None:
    rt, d = checkpoint.realtime, checkpoint.realtime.depth
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"{TITLE} depth transformer")
    w.add_string("moss.file_type", file_type)
    w.add_block_count(d.layers)
    w.add_embedding_length(d.hidden)
    w.add_feed_forward_length(d.ffn)
    w.add_head_count(d.heads)
    w.add_head_count_kv(d.kv_heads)
    w.add_key_length(d.head_dim)
    w.add_value_length(d.head_dim)
    w.add_rope_freq_base(d.rope_theta)
    w.add_layer_norm_rms_eps(d.rms_eps)
    for key, value in (("rvq", rt.rvq), ("audio_vocab_size", rt.audio_vocab),
                       ("audio_pad_token", rt.audio_pad), ("text_pad", rt.text_pad),
                       ("reference_audio_pad", rt.reference_audio_pad)):  # fmt: skip
        w.add_uint32(f"{ARCH}.{key}", value)


def write_depth(checkpoint: RealtimeCheckpoint, path: Path, file_type: str,
                progress: ProgressReporter | None = None) -> Path:  # fmt: skip
    """The depth GGUF at PATH (the caller's temporary name) for FILE_TYPE; one tensor in
    memory at a time."""
    bar = ensure(progress)
    plan = plan_depth(checkpoint, file_type)
    w = gguf.GGUFWriter(path=None, arch=ARCH)
    _add_keys(w, checkpoint, file_type)
    for t in plan:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    try:
        w.write_header_to_file(path=Path(path))
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        bar.start("depth", f"depth transformer ({file_type})", len(plan), "")
        for t in plan:
            w.write_tensor_data(_encode(checkpoint.tensors[t.source].read_f32(), t))
            bar.advance("depth", 1, description=t.name)
    finally:
        w.close()
    bar.finish("depth")
    return Path(path)


def _encode(rows: np.ndarray, t: DepthTensor) -> np.ndarray:
    """ROWS (float32) as T's type stores them, by ggml's own routines."""
    rows = np.ascontiguousarray(rows, np.float32)
    if t.qtype == QT.F32:
        return rows
    out = np.empty(t.nbytes, np.uint8)
    written = libggml.quantize_rows(int(t.qtype), rows, out, 0, rows.shape[0], None)
    if written != t.nbytes:
        raise AssertionError(f"ggml wrote {written} bytes of {t.name}, planned {t.nbytes}")
    return out


def dims_of(reader: gguf.GGUFReader) -> QwenDims:
    """The depth transformer's dims as a depth GGUF says them."""
    def get(key: str) -> float:
        field = reader.fields.get(f"{ARCH}.{key}")
        if field is None:
            raise InputError(f"the depth GGUF has no {ARCH}.{key}", path=Path(reader.data.filename),
                             hint="convert the model again")  # fmt: skip
        return field.parts[field.data[0]][0].item()

    return QwenDims(hidden=int(get("embedding_length")), layers=int(get("block_count")),
                    heads=int(get("attention.head_count")),
                    kv_heads=int(get("attention.head_count_kv")),
                    head_dim=int(get("attention.key_length")),
                    ffn=int(get("feed_forward_length")),
                    rope_theta=float(get("rope.freq_base")),
                    rms_eps=float(get("attention.layer_norm_rms_epsilon")),
                    context=None)  # fmt: skip

