"""The layers a transformer block is built of, over graphs/graph.Graph, with keyword
arguments: layer_norm, rms_norm, linear, rope (settings in `Rope`), attention over split
heads, merge_heads, and causal_mask (a mask input's values).

Each builder names its result NAME and what it makes on the way NAME.<part>
(`blk.0.attn_norm` and `blk.0.attn_norm.normed`), so a dump reads as the model does.
May import: graphs/graph, graphs/ops, graphs/tensor.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .graph import Graph
from .tensor import Tensor


def layer_norm(g: Graph, x: Tensor, *, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float, name: str) -> Tensor:  # fmt: skip
    """LayerNorm of each row of X: normalised, × WEIGHT, + BIAS (each where given)."""
    return _affine(g, g.norm(x, eps, name=f"{name}.normed"), weight, bias, name)


def rms_norm(g: Graph, x: Tensor, *, weight: Tensor | None = None, eps: float,
             name: str) -> Tensor:  # fmt: skip
    """RMSNorm of each row of X, × WEIGHT where given."""
    return _affine(g, g.rms_norm(x, eps, name=f"{name}.normed"), weight, None, name)


def _affine(g: Graph, t: Tensor, weight: Tensor | None, bias: Tensor | None,
            name: str) -> Tensor:  # fmt: skip
    if weight is None and bias is None:
        return g.named(t, name)
    if weight is not None:
        t = g.mul(t, weight, name=name if bias is None else f"{name}.scaled")
    return t if bias is None else g.add(t, bias, name=name)


def linear(g: Graph, x: Tensor, weight: Tensor, bias: Tensor | None = None, *,
           name: str) -> Tensor:  # fmt: skip
    """X's rows times WEIGHT [in, out] (a torch Linear's (out, in) matrix), + BIAS."""
    t = g.mul_mat(weight, x, name=name if bias is None else f"{name}.mm")
    return t if bias is None else g.add(t, bias, name=name)


class RopeMode(enum.IntEnum):  # ggml.h, GGML_ROPE_TYPE_*
    NORMAL = 0  # rotate adjacent pairs (x0, x1), (x2, x3), ... (GPT-J, GPT-2 variants)
    NEOX = 2  # rotate x[i] with x[i + n_dims / 2] (GPT-NeoX, llama.cpp's starcoder2)


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding settings, as ggml_rope_ext takes them (defaults: plain
    RoPE, no YaRN scaling)."""

    n_dims: int  # the leading dims of each head rotated
    mode: RopeMode = RopeMode.NORMAL
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    n_ctx_orig: int = 0  # YaRN's original context (0: unused)
    ext_factor: float = 0.0  # YaRN: 0 turns it off
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def rope(g: Graph, x: Tensor, positions: Tensor, settings: Rope, *,
         freq_factors: Tensor | None = None, name: str) -> Tensor:  # fmt: skip
    """X [head_dim, heads, rows] rotated by POSITIONS [rows] (int32): X's ne[2] entries each
    take the position of the same index."""
    s = settings
    return g.named(g.ggml.ggml_rope_ext(
        g.ctx, x, positions, freq_factors, s.n_dims, int(s.mode), s.n_ctx_orig, s.freq_base,
        s.freq_scale, s.ext_factor, s.attn_factor, s.beta_fast, s.beta_slow), name)  # fmt: skip


def attention(g: Graph, q: Tensor, keys: Tensor, values: Tensor, *, mask: Tensor | None = None,
              scale: float, name: str) -> Tensor:  # fmt: skip
    """Scaled dot-product attention, head by head: softmax(keys·q × SCALE + MASK) weighting
    VALUES. Q [head_dim, rows, heads]; KEYS [head_dim, n_keys, heads]; VALUES transposed,
    [n_keys, head_dim, heads] (both products read contiguous rows); MASK [n_keys, rows]
    (0 or -inf: `causal_mask`). Returns [head_dim, rows, heads]."""
    scores = g.mul_mat(keys, q, name=f"{name}.scores")
    probs = g.soft_max(scores, mask, scale=scale, name=f"{name}.probs")
    return g.mul_mat(values, probs, name=name)


def merge_heads(g: Graph, t: Tensor, *, name: str) -> Tensor:
    """`attention`'s [head_dim, rows, heads] as contiguous rows [head_dim × heads, rows]."""
    hd, rows, heads = (t.ne + (1, 1))[:3]
    moved = g.permute(t, (0, 2, 1, 3), name=f"{name}.heads")
    return g.cont(moved, (hd * heads, rows), name=name)


def causal_mask(positions: np.ndarray, n_keys: int) -> np.ndarray:
    """A mask's values (rows, n_keys): row i sees the keys at positions[i] and before."""
    return np.where(np.arange(n_keys)[None, :] <= positions[:, None], 0.0, -np.inf)
