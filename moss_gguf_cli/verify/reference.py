"""A reference Qwen3 forward in torch, written from the math, to check what llama.cpp computes.

Input: summed input embeddings (S × hidden, float32) — what MOSS feeds its backbone: the text
embedding plus one embedding per audio codebook. Output: the hidden states after the final
RMSNorm, and optionally the logits of ``lm_head``. Weights come from a MOSS checkpoint or an
extracted backbone (anything `convert` accepts), read tensor by tensor.

The model, per layer (pre-norm residual blocks):

    h = x + Wo · attn(rope(qnorm(Wq · rms(x))), rope(knorm(Wk · rms(x))), Wv · rms(x))
    x = h + Wd · (silu(Wg · rms(h)) ⊙ (Wu · rms(h)))

RMSNorm: x / sqrt(mean(x²) + eps) · w; q/k norms apply per head over head_dim. RoPE is the
NEOX layout (the two halves of each head rotate together) with base rope_theta. Attention is
causal, grouped-query (query head i reads key/value head i // (heads / kv_heads)), scaled by
1/sqrt(head_dim). torch is the optional ``torch`` extra, imported lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, UsageError, extra_hint
from ..gguf.write import Qwen3Params, SourceTensor
from ..source.backbone import open_backbone
from ..source.safetensors_io import bf16_to_f32

if TYPE_CHECKING:
    import torch


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise UsageError(
            "the reference forward needs torch", hint=extra_hint("torch")
        ) from exc
    return torch


def read_source_f32(src: SourceTensor) -> np.ndarray:
    """A whole tensor widened to float32, read with plain file reads."""
    dtype = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}[src.dtype]
    with open(src.path, "rb") as f:
        f.seek(src.offset)
        raw = f.read(src.nbytes)
    if len(raw) != src.nbytes:
        raise InputError(f"tensor {src.name!r} ends early", path=src.path)
    arr = np.frombuffer(raw, dtype=dtype).reshape(src.shape)
    if src.dtype == "BF16":
        return bf16_to_f32(arr)
    return arr.astype(np.float32)


@dataclass
class Qwen3Weights:
    """The backbone's tensors by Qwen3ForCausalLM name, loaded on first use."""

    params: Qwen3Params
    sources: dict[str, SourceTensor]
    dtype: Any = None  # torch dtype of the computation (float64 by default)
    _cache: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._cache:
            torch = _torch()
            src = self.sources.get(name)
            if src is None:
                raise InputError(f"tensor {name!r} is missing from the weights")
            self._cache[name] = torch.from_numpy(read_source_f32(src)).to(self.dtype)
        return self._cache[name]


def load_weights(source: Path, dtype: Any = None) -> Qwen3Weights:
    """Weights of the backbone in SOURCE (a MOSS checkpoint, an extract output or a backbone)."""
    torch = _torch()
    backbone = open_backbone(Path(source))
    return Qwen3Weights(backbone.params, backbone.tensors, dtype or torch.float64)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * (x.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt() * weight


def rope_neox(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate (S, heads, D): pair i with i + D/2, angle = pos · theta^(-2i/D)."""
    torch = _torch()
    d = x.shape[-1]
    half = d // 2
    inv_freq = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2 / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (S, D/2)
    cos = angles.cos().to(x.dtype)[:, None, :]
    sin = angles.sin().to(x.dtype)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention: q (S, H, D), k/v (S, KV, D) → (S, H·D)."""
    torch = _torch()
    s, heads, d = q.shape
    group = heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
    return out.reshape(s, heads * d)


def forward(
    weights: Qwen3Weights, embeds: np.ndarray | torch.Tensor, *, logits: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Final-norm hidden states (S × hidden, float32) for summed input embeddings."""
    torch = _torch()
    hp = weights.params
    x = torch.as_tensor(np.asarray(embeds, dtype=np.float32)).to(weights.dtype)
    if x.ndim != 2 or x.shape[1] != hp.hidden:
        raise UsageError(f"embeddings must be S × {hp.hidden}, got {list(x.shape)}")
    s = x.shape[0]
    pos = torch.arange(s)
    eps, w = hp.rms_eps, weights
    with torch.no_grad():
        for n in range(hp.n_layers):
            p = f"model.layers.{n}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(s, hp.heads, hp.head_dim)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(s, hp.kv_heads, hp.head_dim)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(s, hp.kv_heads, hp.head_dim)
            q = rope_neox(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), pos, hp.rope_theta)
            k = rope_neox(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), pos, hp.rope_theta)
            x = x + attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
            up = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate * up) @ w[p + "mlp.down_proj.weight"].T
        hidden = rms_norm(x, w["model.norm.weight"], eps)
        if not logits:
            return hidden.to(torch.float32).numpy()
        head = "lm_head.weight" if "lm_head.weight" in w.sources else "model.embed_tokens.weight"
        out = hidden @ w[head].T
        return hidden.to(torch.float32).numpy(), out.to(torch.float32).numpy()
