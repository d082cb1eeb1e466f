"""One ggml compute graph as an object: its context, named inputs and outputs as NumPy views
of ggml's memory, compute, and a dump of its nodes by name.

Holds `Graph`, `CpuBackend` (what computes graphs, with its thread count) and `Node` (a line
of `Graph.dump`).

    g = Graph(nodes=64, label="a test")
    x = g.input("x", GgmlType.F32, (8, 3))          # ggml order: 3 rows of 8
    g.expand(g.output(g.gelu(x, name="y"))); g.allocate()
    g.inputs["x"][:] = np.ones((3, 8)); g.compute(2); g.outputs["y"]

May import: native/ (libggml), the top level (errors) and graphs/ops, graphs/tensor, graphs/types.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

from ..errors import ToolError
from ..native import libggml
from .ops import Ops
from .tensor import Tensor, set_name
from .types import GgmlType, numpy_dtype


class Node(NamedTuple):
    """A node of a graph as `Graph.dump` lists it."""

    name: str
    op: str  # ggml_op_desc: ADD, MUL_MAT, GELU, ...
    type: str  # GgmlType's name
    shape: tuple[int, ...]  # ggml order, trailing 1s dropped


class CpuBackend:
    """ggml's CPU backend with THREADS threads. It keeps a work buffer between computes: one
    backend a user (two threads must not compute on one at once)."""

    def __init__(self, threads: int = 1):
        g = libggml.load()
        self._cpu, self._base = g.cpu, g.base
        self.ptr = self._cpu.ggml_backend_cpu_init()
        if not self.ptr:
            raise ToolError("ggml cannot start its CPU backend")
        self.threads = 0
        self.set_threads(threads)

    def set_threads(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._cpu.ggml_backend_cpu_set_n_threads(self.ptr, self.threads)

    def compute(self, graph: int) -> int:
        """ggml's status of computing GRAPH (0: done)."""
        return self._base.ggml_backend_graph_compute(self.ptr, graph)

    def close(self) -> None:
        if self.ptr:
            self._base.ggml_backend_free(self.ptr)
        self.ptr = None


class Graph(Ops):
    """A graph of up to NODES tensors (every tensor it makes counts, views too) in a context
    of its own. Build it with the methods of Ops and graphs/layers, `expand` it from its
    results, `allocate` it, then write `inputs`, `compute`, read `outputs`; `close` frees it.
    BACKEND computes it (default: one of its own, made at the first compute)."""

    def __init__(self, nodes: int, *, backend: CpuBackend | None = None,
                 label: str = "a ggml graph"):  # fmt: skip
        self.ggml = libggml.load().base
        self.ctx, self.graph = libggml.new_graph(nodes)
        self.label = label  # how errors name it: "the global transformer"
        self._backend, self._own_backend = backend, None
        self._alloc = None
        self._arrays: dict[str, tuple[Tensor, tuple[int, ...]]] = {}  # inputs and buffers
        self._outputs: dict[str, Tensor] = {}
        self.inputs: dict[str, np.ndarray] = {}  # filled by `allocate`
        self.outputs: dict[str, np.ndarray] = {}

    # -- building

    def new_tensor(self, name: str, kind: GgmlType, ne: tuple[int, ...]) -> Tensor:
        """A new tensor shaped NE (ggml order: ne[0] the row, 1 to 3 dims)."""
        fn = {1: self.ggml.ggml_new_tensor_1d, 2: self.ggml.ggml_new_tensor_2d,
              3: self.ggml.ggml_new_tensor_3d}[len(ne)]  # fmt: skip
        return set_name(fn(self.ctx, int(kind), *ne), name)

    def input(self, name: str, kind: GgmlType, ne: tuple[int, ...]) -> Tensor:
        """An input: `inputs[name]` after `allocate`, a NumPy view shaped NE reversed (rows
        first). Write it before every compute: ggml reuses an input's memory after its last
        reader."""
        t = self.new_tensor(name, kind, ne)
        self.ggml.ggml_set_input(t)
        self._arrays[name] = (t, ne)
        return t

    def buffer(self, name: str, kind: GgmlType, ne: tuple[int, ...]) -> Tensor:
        """A tensor whose memory stays the caller's across computes (flagged an output, so
        ggml never reuses it): an input written once or read back after a compute, or a
        result the graph writes through views. In both `inputs` and `outputs`."""
        t = self.new_tensor(name, kind, ne)
        self.ggml.ggml_set_output(t)
        self._arrays[name] = (t, ne)
        self._outputs[name] = t
        return t

    def output(self, t: Tensor) -> Tensor:
        """T kept after a compute, as `outputs[its name]`."""
        self.ggml.ggml_set_output(t)
        self._outputs[t.name] = t
        return t

    def expand(self, t: Tensor) -> None:
        """Add T and what it needs to the graph; nodes run in the order they are added."""
        self.ggml.ggml_build_forward_expand(self.graph, t)

    def tensor(self, name: str) -> Tensor:
        """The graph's tensor (node or leaf) named NAME."""
        ptr = self.ggml.ggml_graph_get_tensor(self.graph, name.encode())
        if not ptr:
            raise KeyError(name)
        return Tensor(ptr)

    # -- running

    def allocate(self) -> None:
        """Place the graph's tensors in CPU memory and make the NumPy views."""
        self._alloc = libggml.allocate(self.graph)
        for name, (t, ne) in self._arrays.items():
            self.inputs[name] = _array(t, tuple(reversed(ne)))
        for name, t in self._outputs.items():
            self.outputs[name] = (self.inputs[name] if name in self._arrays
                                  else _array(t, tuple(reversed(t.ne))))  # fmt: skip

    def compute(self, n_threads: int | None = None) -> None:
        """Run the graph on its backend (N_THREADS: change its thread count first)."""
        backend = self._backend or self._own_backend
        if backend is None:
            backend = self._own_backend = CpuBackend(n_threads or 1)
        elif n_threads is not None and n_threads != backend.threads:
            backend.set_threads(n_threads)
        status = backend.compute(self.graph)
        if status != 0:
            raise ToolError(f"ggml could not compute {self.label} (status {status})")

    def dump(self) -> list[Node]:
        """Every node, in the order they run: (name, op, type, shape)."""
        out = []
        for i in range(self.ggml.ggml_graph_n_nodes(self.graph)):
            t = Tensor(self.ggml.ggml_graph_node(self.graph, i))
            out.append(Node(t.name, t.op, t.type.name, t.ne))
        return out

    def close(self) -> None:
        if self._alloc:
            self.ggml.ggml_gallocr_free(self._alloc)
        self._alloc = None
        if self._own_backend is not None:
            self._own_backend.close()
        self._own_backend = None
        if self.ctx:
            self.ggml.ggml_free(self.ctx)
        self.ctx, self.inputs, self.outputs = None, {}, {}

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _array(t: Tensor, shape: tuple[int, ...]) -> np.ndarray:
    """A NumPy view of T's data shaped SHAPE; zeros of its own where T has no memory (a
    tensor no node reads is not placed)."""
    dtype = numpy_dtype(t.type)
    address = t.data
    if not address:
        return np.zeros(shape, dtype)
    raw = (ctypes.c_byte * (int(np.prod(shape)) * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype).reshape(shape)
