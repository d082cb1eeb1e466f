"""ggml compute graphs built from Python: what a model family's runtime builds on.

Holds types (`GgmlType`, the one enum of ggml's type ids, and their sizes asked of ggml),
tensor (`Tensor`: a ggml tensor's pointer, type, shape and name), ops (ggml's operations as
methods that name their results), graph (`Graph`: a context and graph with named NumPy inputs
and outputs, `compute`, `dump`; `CpuBackend`), store (`Weights`, `Borrowed`: tensors that
outlive a graph) and layers (layer_norm, rms_norm, linear, rope, attention, ...).

May import: native/ (libggml), disk/, gguf/ and the top level (errors, progress) (rank 3,
below every room that speaks, so tts/ and each family may build on it); never source/ (beside
it) or anything above.
"""

from .graph import CpuBackend, Graph, Node
from .layers import (
    Rope,
    RopeMode,
    attention,
    causal_mask,
    layer_norm,
    linear,
    merge_heads,
    rms_norm,
    rope,
)
from .ops import SortOrder
from .store import Borrowed, Owner, Weights, aligned, overhead
from .tensor import Tensor
from .types import TYPE_IDS, GgmlType, block_size, numpy_dtype, row_size, tensor_bytes, type_size

__all__ = [
    "TYPE_IDS",
    "Borrowed",
    "Owner",
    "CpuBackend",
    "GgmlType",
    "Graph",
    "Node",
    "Rope",
    "RopeMode",
    "SortOrder",
    "Tensor",
    "Weights",
    "aligned",
    "attention",
    "block_size",
    "causal_mask",
    "layer_norm",
    "linear",
    "merge_heads",
    "numpy_dtype",
    "overhead",
    "rms_norm",
    "row_size",
    "rope",
    "tensor_bytes",
    "type_size",
]
