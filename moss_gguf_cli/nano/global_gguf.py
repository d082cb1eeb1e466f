"""Nano's global transformer as a GGUF of llama.cpp's `starcoder2` architecture.

Nano's block is starcoder2's: pre-LayerNorm with biases, one biased q/k/v projection, RoPE,
softmax attention scaled by 1/sqrt(head size), a biased output projection, a biased two-layer
GELU (tanh form, upstream's "gelu_new") feed-forward, a final LayerNorm. Two differences, and
how each is removed:

- RoPE. Upstream rotates interleaved pairs (dims 2i, 2i+1: ggml's NORMAL rope); starcoder2
  rotates halves (i, i + d/2: NEOX). Each head's q and k rows are written permuted, even dims
  first, then odd (`neox_order`): NEOX on the permuted vector is NORMAL on the original, and
  q·k is unchanged by one permutation applied to both. V and the output projection are not
  touched, so the attention output is upstream's.
- The text head is tied to `transformer.wte`: starcoder2 reads `output.weight` when present,
  else uses `token_embd`; it is left out.

starcoder2 is chosen over codeshell, which has the same block, because codeshell requires its
own `output.weight` (a second copy of the 16384 × 768 table). The text is tokenized outside
llama.cpp (the release's tokenizer.model): the GGUF says `no_vocab` and its vocabulary size,
and inputs go in as embeddings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..errors import InputError
from .checkpoint import NanoCheckpoint
from .config import TransformerDims

ARCH = "starcoder2"


def neox_order(head_dim: int) -> np.ndarray:
    """The row order within one head that makes NEOX rope act as interleaved (NORMAL) rope."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def permute_qk(rows: np.ndarray, hidden: int, heads: int) -> np.ndarray:
    """c_attn's [3·hidden, ...] rows (or bias) with each q and k head in `neox_order`."""
    head_dim = hidden // heads
    within = neox_order(head_dim)
    order = np.arange(3 * hidden)
    for part in (0, 1):  # q, k; v (part 2) keeps its order
        for h in range(heads):
            start = part * hidden + h * head_dim
            order[start : start + head_dim] = start + within
    return rows[order]


@dataclass(frozen=True)
class GlobalTensor:
    name: str  # the GGUF's name
    source: str  # the checkpoint's name
    permuted: bool = False  # rows in neox_order per q/k head


def plan_global_tensors(layers: int) -> list[GlobalTensor]:
    """The GGUF's tensors, in llama.cpp's loading order, each with the tensor it comes from."""
    plan = [GlobalTensor("token_embd.weight", "transformer.wte.weight")]
    for i in range(layers):
        src, dst = f"transformer.h.{i}.", f"blk.{i}."
        for kind in ("weight", "bias"):
            plan += [
                GlobalTensor(f"{dst}attn_norm.{kind}", f"{src}ln_1.{kind}"),
                GlobalTensor(f"{dst}attn_qkv.{kind}", f"{src}attn.c_attn.{kind}", permuted=True),
                GlobalTensor(f"{dst}attn_output.{kind}", f"{src}attn.c_proj.{kind}"),
                GlobalTensor(f"{dst}ffn_norm.{kind}", f"{src}ln_2.{kind}"),
                GlobalTensor(f"{dst}ffn_up.{kind}", f"{src}mlp.fc_in.{kind}"),
                GlobalTensor(f"{dst}ffn_down.{kind}", f"{src}mlp.fc_out.{kind}"),
            ]
    plan += [GlobalTensor(f"output_norm.{kind}", f"transformer.ln_f.{kind}")
             for kind in ("weight", "bias")]  # fmt: skip
    return plan


def global_array(checkpoint: NanoCheckpoint, tensor: GlobalTensor) -> np.ndarray:
    """One tensor's float32 values as the GGUF holds them."""
    values = np.asarray(checkpoint.tensors[tensor.source], dtype=np.float32)
    if tensor.permuted:
        dims = checkpoint.nano.dims
        values = permute_qk(values, dims.hidden, dims.heads)
    return np.ascontiguousarray(values)


def write_global_f32(checkpoint: NanoCheckpoint, path: Path) -> Path:
    """Write the global transformer as an F32 starcoder2 GGUF at PATH (the parity reference;
    other file types come from it through the quantize pipeline)."""
    dims = checkpoint.nano.dims
    if dims.context is None:
        raise InputError(
            "config.json's gpt2_config has no n_positions, which the GGUF states as its "
            "context length",
            path=checkpoint.root / "config.json",
        )
    tensors = ((t.name, global_array(checkpoint, t)) for t in plan_global_tensors(dims.layers))
    return write_starcoder2_f32(path, dims, dims.layers, dims.context, dims.vocab, tensors)


def write_starcoder2_f32(
    path: Path,
    dims: TransformerDims,
    layers: int,
    context: int,
    vocab: int,
    tensors: Iterable[tuple[str, np.ndarray]],
) -> Path:
    """An F32 starcoder2 GGUF of LAYERS of Nano's blocks at PATH: its keys from DIMS, then
    TENSORS (GGUF name, float32 values) in the order given. No vocabulary: inputs go in as
    embeddings."""
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_context_length(context)
    writer.add_embedding_length(dims.hidden)
    writer.add_feed_forward_length(dims.inner)
    writer.add_block_count(layers)
    writer.add_head_count(dims.heads)
    writer.add_head_count_kv(dims.heads)
    writer.add_layer_norm_eps(dims.eps)
    writer.add_rope_freq_base(dims.rope_base)
    writer.add_rope_dimension_count(dims.head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("no_vocab")
    for name, values in tensors:
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
