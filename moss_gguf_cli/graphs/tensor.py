"""A ggml tensor as a Python object: its pointer (what ctypes passes), type, shape, strides,
name and op, read from ggml's own struct and functions.

Holds `Tensor`, `MAX_NAME` and `set_name`.
May import: native/ (libggml) and graphs/types.
"""

from __future__ import annotations

import ctypes

from ..native import libggml
from .types import GgmlType

MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 63  # GGML_MAX_NAME less its terminating zero: ggml cuts a longer name short


class _Head(ctypes.Structure):
    """The first fields of ggml.h's struct ggml_tensor (read only; the rest is ggml's)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * MAX_DIMS),  # elements a dimension, ne[0] the row
        ("nb", ctypes.c_size_t * MAX_DIMS),  # bytes between consecutive entries of each
    ]


class Tensor:
    """One ggml tensor of a context that outlives this object. ctypes passes it as its
    pointer (`_as_parameter_`), so a Tensor goes straight into any libggml call."""

    __slots__ = ("_as_parameter_",)

    def __init__(self, ptr: int):
        if not ptr:
            raise ValueError("ggml returned no tensor")
        self._as_parameter_ = ptr

    @property
    def ptr(self) -> int:
        return self._as_parameter_

    def _head(self) -> _Head:
        return _Head.from_address(self._as_parameter_)

    @property
    def type(self) -> GgmlType:
        return GgmlType(self._head().type)

    @property
    def ne(self) -> tuple[int, ...]:
        """The shape in ggml's order (ne[0] the contiguous row), trailing 1s dropped."""
        return tuple(self._head().ne[: libggml.load().base.ggml_n_dims(self)])

    @property
    def nb(self) -> tuple[int, ...]:
        """Byte strides, one a dimension of `ne`."""
        return tuple(self._head().nb[: len(self.ne)])

    def stride(self, dim: int) -> int:
        """Bytes between consecutive entries of dimension DIM (any of the four)."""
        return int(self._head().nb[dim])

    @property
    def nelements(self) -> int:
        return int(libggml.load().base.ggml_nelements(self))

    @property
    def nbytes(self) -> int:
        return int(libggml.load().base.ggml_nbytes(self))

    @property
    def data(self) -> int:
        """The address of its data; 0 where it has none (not allocated, or unused)."""
        return libggml.load().base.ggml_get_data(self) or 0

    @property
    def name(self) -> str:
        return (libggml.load().base.ggml_get_name(self) or b"").decode()

    @property
    def op(self) -> str:
        """ggml's name of the operation that computes it (NONE for a leaf; GELU, not UNARY)."""
        return (libggml.load().base.ggml_op_desc(self) or b"").decode()

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.op}, {self.type.name}, {list(self.ne)})"


def set_name(t: int | Tensor, name: str) -> Tensor:
    """T named NAME (ggml_set_name); a name ggml would cut short is refused."""
    encoded = name.encode()
    if not encoded or len(encoded) > MAX_NAME:
        raise ValueError(f"a ggml tensor name is 1 to {MAX_NAME} bytes: {name!r}")
    tensor = t if isinstance(t, Tensor) else Tensor(t)
    libggml.load().base.ggml_set_name(tensor, encoded)
    return tensor
