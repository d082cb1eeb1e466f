"""Tensors that outlive a graph: weights and caches in a ggml context that holds their data
(`Weights`), and NumPy arrays lent to ggml in place, not copied (`Borrowed`).

Every tensor is named (the name the weight has in its file, or the cache's), so a graph that
reads one shows it by name.
May import: native/ (libggml) and graphs/tensor, graphs/types.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..native import libggml
from .tensor import Tensor, set_name
from .types import GgmlType, numpy_dtype

SLACK = 64  # bytes a tensor may lose to alignment in a context (ggml aligns data to 16..64)


def overhead(n_tensors: int) -> int:
    """Bytes of context that N_TENSORS tensor headers take, alignment included."""
    return n_tensors * (int(libggml.load().base.ggml_tensor_overhead()) + SLACK)


class Owner:
    """Something that holds ggml resources in attributes (weights, backends, graphs):
    `release(*names)` closes those that are set (a part-built owner too) and unsets them, and
    the owner closes itself when it is collected."""

    def release(self, *names: str) -> None:
        for name in names:
            part = getattr(self, name, None)
            if part is not None:
                part.close()
            setattr(self, name, None)

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have unloaded ctypes
            pass


class Weights:
    """A ggml context of SIZE bytes whose tensors hold their own data (weights, caches)."""

    def __init__(self, size: int):
        self.ggml = libggml.load().base
        self.ctx = self.ggml.ggml_init(libggml.InitParams(size, None, False))
        if not self.ctx:
            raise libggml.GgmlUnavailable("ggml_init failed (out of memory?)")

    def new(self, name: str, kind: GgmlType, ne: tuple[int, ...]) -> Tensor:
        """A tensor shaped NE (ggml order), its data not set."""
        fn = {1: self.ggml.ggml_new_tensor_1d, 2: self.ggml.ggml_new_tensor_2d,
              3: self.ggml.ggml_new_tensor_3d}[len(ne)]  # fmt: skip
        return set_name(fn(self.ctx, int(kind), *ne), name)

    def array(self, t: Tensor) -> np.ndarray:
        """T's data as a NumPy view (a plain type), shaped its ne reversed (rows first)."""
        shape = tuple(reversed(t.ne))
        dtype = numpy_dtype(t.type)
        raw = (ctypes.c_byte * t.nbytes).from_address(t.data)
        return np.frombuffer(raw, dtype).reshape(shape)

    def raw(self, t: Tensor) -> ctypes.Array:
        """T's bytes, writable (for readinto)."""
        return (ctypes.c_char * t.nbytes).from_address(t.data)

    def zeros(self, name: str, kind: GgmlType, ne: tuple[int, ...]) -> Tensor:
        """A tensor of zeros (unset memory may hold NaN, and 0 × NaN is NaN)."""
        t = self.new(name, kind, ne)
        self.array(t)[...] = 0
        return t

    def from_numpy(self, name: str, values: np.ndarray, kind: GgmlType = GgmlType.F32) -> Tensor:
        """A float32 vector or (rows, cols) matrix as a tensor [cols, rows] of KIND: copied
        for F32, else converted by ggml's own quantization (what llama-quantize writes)."""
        src = np.ascontiguousarray(values, dtype=np.float32)
        t = self.new(name, kind, tuple(reversed(src.shape)))
        if kind == GgmlType.F32:
            self.array(t)[...] = src
        else:
            rows, cols = src.shape if src.ndim == 2 else (1, src.shape[0])
            self.ggml.ggml_quantize_chunk(int(kind), src.ctypes.data_as(libggml.FloatP), t.data,
                                          0, rows, cols, None)  # fmt: skip
        return t

    def close(self) -> None:
        if self.ctx:
            self.ggml.ggml_free(self.ctx)
        self.ctx = None


class Borrowed:
    """Float32 NumPy arrays as ggml tensors over their own memory (32-byte aligned, C order:
    see `aligned`). The arrays must outlive this object; up to N_TENSORS of them."""

    def __init__(self, n_tensors: int):
        self.ggml = libggml.load().base
        self.ctx = self.ggml.ggml_init(libggml.InitParams(overhead(n_tensors), None, True))
        if not self.ctx:
            raise libggml.GgmlUnavailable("ggml_init failed (out of memory?)")
        self._buffers: list[int] = []

    def place(self, name: str, table: np.ndarray) -> Tensor:
        """TABLE (rows, cols) as a tensor [cols, rows] reading its memory."""
        rows, cols = table.shape
        t = set_name(self.ggml.ggml_new_tensor_2d(self.ctx, int(GgmlType.F32), cols, rows), name)
        buffer = self.ggml.ggml_backend_cpu_buffer_from_ptr(table.ctypes.data, table.nbytes)
        if not buffer:
            raise libggml.GgmlUnavailable("ggml cannot wrap a table's memory")
        self._buffers.append(buffer)
        if self.ggml.ggml_backend_tensor_alloc(buffer, t, table.ctypes.data) != 0:
            raise libggml.GgmlUnavailable("ggml cannot place a table in its memory")
        return t

    def close(self) -> None:
        for buffer in self._buffers:
            self.ggml.ggml_backend_buffer_free(buffer)
        self._buffers = []
        if self.ctx:
            self.ggml.ggml_free(self.ctx)
        self.ctx = None


ALIGN = 32  # the address ggml needs a borrowed array at


def aligned(table: np.ndarray) -> np.ndarray:
    """TABLE as C-ordered float32 at an address ggml can place a tensor at (32 bytes): the
    array itself when it is, else a copy (give it the copy to keep one)."""
    table = np.ascontiguousarray(table, dtype=np.float32)
    if table.ctypes.data % ALIGN == 0:
        return table
    raw = np.empty(table.size + ALIGN // 4, np.float32)
    skip = (-raw.ctypes.data % ALIGN) // 4
    out = raw[skip : skip + table.size].reshape(table.shape)
    out[:] = table
    return out
