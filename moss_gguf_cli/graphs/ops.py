"""ggml's operations as methods that name what they make: the primitives a graph is built of.

Holds `Ops`, the part of graphs/graph.Graph that adds tensors to its context: one method an
operation, its name a required keyword (a graph dumps by name, so nothing goes unnamed), and
`view`, whose strides and offsets are counted in elements and turned into bytes by ggml
(ggml_row_size), so no caller writes a byte stride. Composite layers: graphs/layers.py.
May import: native/ (libggml), graphs/types and graphs/tensor.
"""

from __future__ import annotations

import ctypes
import enum

from .tensor import Tensor, set_name
from .types import GgmlType, row_size


class SortOrder(enum.IntEnum):  # ggml.h, enum ggml_sort_order
    ASC = 0
    DESC = 1


class Ops:
    """Operations on tensors of one ggml context (`ctx`, through `ggml`, libggml-base)."""

    ctx: int
    ggml: ctypes.CDLL

    def named(self, ptr: int | Tensor, name: str) -> Tensor:
        """The tensor a raw libggml call returned, named NAME."""
        return set_name(ptr, name)

    # -- arithmetic, element by element (b broadcast over a where ggml allows it)

    def add(self, a: Tensor, b: Tensor, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_add(self.ctx, a, b), name)

    def sub(self, a: Tensor, b: Tensor, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_sub(self.ctx, a, b), name)

    def mul(self, a: Tensor, b: Tensor, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_mul(self.ctx, a, b), name)

    def scale(self, a: Tensor, s: float, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_scale(self.ctx, a, s), name)

    def scale_bias(self, a: Tensor, s: float, b: float, *, name: str) -> Tensor:
        """a × s + b."""
        return self.named(self.ggml.ggml_scale_bias(self.ctx, a, s, b), name)

    def clamp(self, a: Tensor, low: float, high: float, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_clamp(self.ctx, a, low, high), name)

    def gelu(self, a: Tensor, *, name: str) -> Tensor:
        """GELU, tanh approximation (GPT-2's)."""
        return self.named(self.ggml.ggml_gelu(self.ctx, a), name)

    def swiglu(self, gate: Tensor, up: Tensor, *, name: str) -> Tensor:
        """SiLU(GATE) × UP (a SwiGLU feed-forward's middle, as llama.cpp's Qwen3 computes it)."""
        return self.named(self.ggml.ggml_swiglu_split(self.ctx, gate, up), name)

    def relu(self, a: Tensor, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_relu(self.ctx, a), name)

    def step(self, a: Tensor, *, name: str) -> Tensor:
        """1 where a > 0, else 0."""
        return self.named(self.ggml.ggml_step(self.ctx, a), name)

    def cast(self, a: Tensor, kind: GgmlType, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_cast(self.ctx, a, int(kind)), name)

    # -- rows and reductions

    def mul_mat(self, a: Tensor, b: Tensor, *, name: str) -> Tensor:
        """a [k, n] times b [k, m] → [n, m]: each of b's rows against each of a's."""
        return self.named(self.ggml.ggml_mul_mat(self.ctx, a, b), name)

    def norm(self, a: Tensor, eps: float, *, name: str) -> Tensor:
        """Each row to mean 0, variance 1 (no weight or bias: graphs/layers.layer_norm)."""
        return self.named(self.ggml.ggml_norm(self.ctx, a, eps), name)

    def rms_norm(self, a: Tensor, eps: float, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_rms_norm(self.ctx, a, eps), name)

    def soft_max(self, a: Tensor, mask: Tensor | None = None, *, scale: float = 1.0,
                 max_bias: float = 0.0, name: str) -> Tensor:  # fmt: skip
        """softmax(a × scale + mask) along each row (ggml_soft_max_ext)."""
        return self.named(self.ggml.ggml_soft_max_ext(self.ctx, a, mask, scale, max_bias), name)

    def sum(self, a: Tensor, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_sum(self.ctx, a), name)

    def cumsum(self, a: Tensor, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_cumsum(self.ctx, a), name)

    def argmax(self, a: Tensor, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_argmax(self.ctx, a), name)

    def argsort(self, a: Tensor, order: SortOrder, *, name: str) -> Tensor:
        return self.named(self.ggml.ggml_argsort(self.ctx, a, int(order)), name)

    def top_k(self, a: Tensor, k: int, *, name: str) -> Tensor:
        """The ids of a row's K largest values, in no particular order."""
        return self.named(self.ggml.ggml_top_k(self.ctx, a, k), name)

    def get_rows(self, a: Tensor, rows: Tensor, *, name: str) -> Tensor:
        """a's rows at the int32 ids ROWS, as float32."""
        return self.named(self.ggml.ggml_get_rows(self.ctx, a, rows), name)

    def set_rows(self, dst: Tensor, src: Tensor, rows: Tensor, *, name: str) -> Tensor:
        """SRC's rows written into DST's rows at the int64 ids ROWS (DST itself, changed)."""
        return self.named(self.ggml.ggml_set_rows(self.ctx, dst, src, rows), name)

    def cpy(self, src: Tensor, dst: Tensor, *, name: str) -> Tensor:
        """SRC's values written into DST (a view of DST, changed)."""
        return self.named(self.ggml.ggml_cpy(self.ctx, src, dst), name)

    # -- shapes

    def view(self, a: Tensor, ne: tuple[int, ...], *, offset: int = 0,
             steps: tuple[int, ...] | None = None, name: str) -> Tensor:  # fmt: skip
        """A view of A shaped NE (ggml order, 1 to 3 dims), starting OFFSET elements of A's
        type in; STEPS: the elements between consecutive entries of ne[1], ne[2] (default:
        A's own strides)."""
        kind, g, ctx = a.type, self.ggml, self.ctx
        at = row_size(kind, offset)
        nb = ([row_size(kind, s) for s in steps] if steps is not None
              else [a.stride(d) for d in range(1, len(ne))])  # fmt: skip
        if len(nb) != len(ne) - 1:
            raise ValueError(f"a view of {len(ne)} dims takes {len(ne) - 1} steps")
        if len(ne) == 1:
            return self.named(g.ggml_view_1d(ctx, a, ne[0], at), name)
        if len(ne) == 2:
            return self.named(g.ggml_view_2d(ctx, a, *ne, nb[0], at), name)
        if len(ne) == 3:
            return self.named(g.ggml_view_3d(ctx, a, *ne, *nb, at), name)
        raise ValueError(f"a view of {len(ne)} dims")

    def reshape(self, a: Tensor, ne: tuple[int, ...], *, name: str) -> Tensor:
        """A contiguous A's elements shaped NE (ggml order), not copied."""
        fn = {1: self.ggml.ggml_reshape_1d, 2: self.ggml.ggml_reshape_2d,
              3: self.ggml.ggml_reshape_3d}[len(ne)]  # fmt: skip
        return self.named(fn(self.ctx, a, *ne), name)

    def cont(self, a: Tensor, ne: tuple[int, int], *, name: str) -> Tensor:
        """A (any strides) copied into a contiguous [ne0, ne1]."""
        return self.named(self.ggml.ggml_cont_2d(self.ctx, a, *ne), name)

    def permute(self, a: Tensor, axes: tuple[int, int, int, int], *, name: str) -> Tensor:
        """A view of A with its dimension i moved to axes[i] (ggml_permute)."""
        return self.named(self.ggml.ggml_permute(self.ctx, a, *axes), name)
