"""ggml's tensor types, one enum for every graph, and their sizes as ggml computes them.

Holds `GgmlType` (the ids of ggml.h's `enum ggml_type`), the NumPy dtype of the plain ones,
and `type_size` / `block_size` / `row_size` / `tensor_bytes`, asked of the loaded libggml
(never written down here: a block's bytes are ggml's to say).
May import: native/ (libggml).
"""

from __future__ import annotations

import enum
import functools
import math

import numpy as np

from ..native import libggml


class GgmlType(enum.IntEnum):
    """ggml's type ids (ggml.h, enum ggml_type); the names are ggml_type_name's, upper case."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# name -> id, for settings that name a type ("Q8_0" in a YAML)
TYPE_IDS: dict[str, GgmlType] = {t.name: t for t in GgmlType}

# the types a NumPy array can view directly (a value an element, no blocks)
_DTYPES = {GgmlType.F32: np.float32, GgmlType.F16: np.float16, GgmlType.F64: np.float64,
           GgmlType.I8: np.int8, GgmlType.I16: np.int16, GgmlType.I32: np.int32,
           GgmlType.I64: np.int64}  # fmt: skip


def numpy_dtype(kind: GgmlType) -> np.dtype:
    """The NumPy dtype of a plain type's elements; ValueError for a block type."""
    try:
        return np.dtype(_DTYPES[GgmlType(kind)])
    except KeyError:
        name = GgmlType(kind).name
        raise ValueError(f"{name} has no NumPy dtype (its values are in blocks)") from None


@functools.cache
def type_size(kind: GgmlType) -> int:
    """Bytes of one block of KIND (one element for a plain type): ggml_type_size."""
    return int(libggml.load().base.ggml_type_size(int(kind)))


@functools.cache
def block_size(kind: GgmlType) -> int:
    """Elements a block of KIND holds (1 for a plain type): ggml_blck_size."""
    return int(libggml.load().base.ggml_blck_size(int(kind)))


def row_size(kind: GgmlType, n: int) -> int:
    """Bytes of N consecutive elements of KIND (N a whole number of blocks): ggml_row_size."""
    return int(libggml.load().base.ggml_row_size(int(kind), n))


def tensor_bytes(kind: GgmlType, ne: tuple[int, ...]) -> int:
    """Bytes of a contiguous tensor of KIND with ggml shape NE (ne[0] the row)."""
    return row_size(kind, ne[0]) * math.prod(ne[1:])
