"""MOSS-TTS-Nano's global transformer as ggml graphs of our own, on the folder's GGUF.

The folder's starcoder2 GGUF is what llama.cpp loads (nano/global_gguf.py says how Nano's
block maps onto it); here the same tensors, at the file's own types, are read into a ggml
context and run by graphs built once per shape. A frame's global step is one row: through
`llama_decode` it pays a batch check, a graph built and scheduled, and attention over keys
padded to a multiple of 256 (512 keys read for a 300-row prompt). Here a step writes its
row, position and mask and computes a graph kept for its key count rounded up to BUCKET
(docs/nano.md, "Speed"). The kernels are the ones llama.cpp runs, from the libggml it
ships; nothing is compiled.

The arithmetic is llama.cpp's starcoder2 graph: LayerNorm with bias, one biased q/k/v
product, NEOX rope (the file's q/k rows are permuted for it), softmax(q·k / sqrt(head)) over
a float16 key/value cache, biased output projection, tanh GELU feed-forward, final
LayerNorm. tests/test_nano_speak.py holds it to llama.cpp's hidden states.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, ToolError
from ..gguf.read import GgufFormatError, header_input_error, read_gguf
from ..native import libggml

GGML_F32, GGML_F16, GGML_I32, GGML_I64 = 0, 1, 26, 27
_ROPE_NEOX = 2
BUCKET = 32  # a step's keys are read rounded up to this (masked); one graph per bucket
STEP_GRAPHS_KEPT = 8  # a 30 s answer spans ~12 buckets: older graphs are rebuilt (~1 ms)
PREFILL_ROWS = 128  # a prompt is computed this many rows at a time
_HINT = "rerun `moss-gguf all` on the model"
_NODES = 48  # a layer adds ~40 nodes and leaves


@dataclass(frozen=True)
class GlobalState:
    """A sequence's first ROWS key/value rows, per layer (`save`/`load`)."""

    rows: int
    keys: list[np.ndarray]
    values: list[np.ndarray]


@dataclass
class _Graph:
    ctx: int
    alloc: int
    graph: int
    x: np.ndarray  # the input rows, (rows, hidden)
    pos: np.ndarray
    mask: np.ndarray  # (rows, keys)
    k_rows: np.ndarray  # cache rows written
    v_rows: np.ndarray  # cache elements written (V is stored transposed)
    out: np.ndarray | None  # the last row's final-norm hidden state


@dataclass(frozen=True)
class _Ops:
    """LayerNorm and biased products over the file's tensors, in one graph's context."""

    b: ctypes.CDLL
    ctx: int
    w: dict[str, int]
    eps: float

    def norm(self, t: int, name: str) -> int:
        b, ctx = self.b, self.ctx
        t = b.ggml_mul(ctx, b.ggml_norm(ctx, t, self.eps), self.w[f"{name}.weight"])
        return b.ggml_add(ctx, t, self.w[f"{name}.bias"])

    def linear(self, t: int, name: str) -> int:
        b, ctx = self.b, self.ctx
        return b.ggml_add(ctx, b.ggml_mul_mat(ctx, self.w[f"{name}.weight"], t),
                          self.w[f"{name}.bias"])  # fmt: skip


class GgmlGlobal:
    """The global transformer of one Nano folder: `prefill`/`fill` a prompt, `step` a row,
    `save`/`load` a prompt's shared rows. One sequence, N_CTX rows."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int, kv_type: str = "F16"):
        g = libggml.load()
        # float16 keys and values, as llama.cpp keeps them; F32 holds the file's own math
        self._kv_kind, self._kv_dtype = {"F16": (GGML_F16, np.float16),
                                         "F32": (GGML_F32, np.float32)}[kv_type]  # fmt: skip
        self._b, self._cpu = g.base, g.cpu
        self.path, self.n_ctx, self.n_past = Path(gguf), n_ctx, 0
        self._ctx = self._backend = None
        self._steps: dict[int, _Graph] = {}
        try:
            header = read_gguf(self.path)
        except GgufFormatError as exc:
            raise header_input_error(self.path, exc) from None
        except OSError as exc:
            raise InputError(f"cannot read the global GGUF ({exc.strerror})", path=self.path,
                             hint=_HINT) from None  # fmt: skip
        self._facts(header)
        try:
            self._load(header)
            self._backend = self._cpu.ggml_backend_cpu_init()
            if not self._backend:
                raise ToolError("ggml cannot start its CPU backend")
            self._cpu.ggml_backend_cpu_set_n_threads(self._backend, max(1, threads))
        except BaseException:
            self.close()
            raise

    def _facts(self, header) -> None:
        kv, arch = header.kv, header.arch

        def fact(key: str) -> int | float:
            value = kv.get(f"{arch}.{key}")
            if not isinstance(value, (int, float)):
                raise InputError(f"the global GGUF has no {arch}.{key}", path=self.path,
                                 hint=_HINT)  # fmt: skip
            return value

        if arch != "starcoder2":
            raise InputError(f"the global GGUF is {arch!r}, not starcoder2", path=self.path,
                             hint=_HINT)  # fmt: skip
        self.hidden, self.layers = int(fact("embedding_length")), int(fact("block_count"))
        self.heads, self.inner = int(fact("attention.head_count")), int(fact("feed_forward_length"))
        self.eps, self.rope_base = float(fact("attention.layer_norm_epsilon")), float(
            fact("rope.freq_base"))  # fmt: skip
        if self.heads < 1 or self.hidden % self.heads:
            raise InputError(f"{self.heads} heads do not divide {self.hidden}", path=self.path)
        self.head_dim = self.hidden // self.heads

    # -- weights

    def _names(self) -> list[str]:
        names = ["output_norm.weight", "output_norm.bias"]
        for i in range(self.layers):
            names += [f"blk.{i}.{n}.{k}" for n in ("attn_norm", "attn_qkv", "attn_output",
                                                   "ffn_norm", "ffn_up", "ffn_down")
                      for k in ("weight", "bias")]  # fmt: skip
        return names

    def _expected(self, name: str) -> tuple[int, ...]:
        h, inner = self.hidden, self.inner
        kind = name.split(".")[-2]
        if name.endswith(".bias") or kind in ("attn_norm", "ffn_norm", "output_norm"):
            return ({"attn_qkv": 3 * h, "ffn_up": inner}.get(kind, h),)
        return {"attn_qkv": (h, 3 * h), "attn_output": (h, h), "ffn_up": (h, inner),
                "ffn_down": (inner, h)}[kind]  # fmt: skip

    def _load(self, header) -> None:
        b = self._b
        names = self._names()
        infos = []
        for name in names:
            info = header.tensors.get(name)
            if info is None:
                raise InputError(f"the global GGUF has no tensor {name}", path=self.path,
                                 hint=_HINT)  # fmt: skip
            if info.dims != self._expected(name) or not header.in_file(info):
                raise InputError(f"tensor {name} is {list(info.dims)} or cut short, not "
                                 f"{list(self._expected(name))}", path=self.path,
                                 hint=_HINT)  # fmt: skip
            infos.append(info)
        import gguf as gguf_py

        kv_bytes = 2 * np.dtype(self._kv_dtype).itemsize * self.hidden * self.n_ctx  # K and V
        size = sum(i.nbytes for i in infos) + self.layers * kv_bytes
        size += (len(infos) + 2 * self.layers + 8) * (b.ggml_tensor_overhead() + 64)
        self._ctx = b.ggml_init(libggml.InitParams(size, None, False))
        if not self._ctx:
            raise libggml.GgmlUnavailable("ggml_init failed (out of memory?)")
        self._w: dict[str, int] = {}
        with open(self.path, "rb") as f:
            for info in infos:
                kind = int(gguf_py.GGMLQuantizationType[info.type_name])
                t = b.ggml_new_tensor_2d(self._ctx, kind, info.dims[0], info.dims[1]) if len(
                    info.dims) == 2 else b.ggml_new_tensor_1d(self._ctx, kind, info.dims[0])
                if b.ggml_nbytes(t) != info.nbytes:
                    raise InputError(f"tensor {info.name} holds {info.nbytes} bytes, ggml "
                                     f"needs {b.ggml_nbytes(t)}", path=self.path, hint=_HINT)
                f.seek(header.abs_offset(info))
                buffer = (ctypes.c_char * info.nbytes).from_address(b.ggml_get_data(t))
                if f.readinto(buffer) != info.nbytes:
                    raise InputError(f"tensor {info.name} is cut short", path=self.path,
                                     hint=_HINT)  # fmt: skip
                self._w[info.name] = t
        # K: a row of HIDDEN a position; V transposed (a channel's positions contiguous), so
        # both attention products read contiguous rows. Zeroed: masked keys are multiplied
        # by zero weights, and unset memory may hold NaN.
        self._k, self._v, self._kv_arrays = [], [], []
        kind, dtype = self._kv_kind, self._kv_dtype
        for _ in range(self.layers):
            k = b.ggml_new_tensor_2d(self._ctx, kind, self.hidden, self.n_ctx)
            v = b.ggml_new_tensor_2d(self._ctx, kind, 1, self.hidden * self.n_ctx)
            ka, va = (libggml.tensor_array(t, self.hidden * self.n_ctx, dtype) for t in (k, v))
            ka[:], va[:] = 0, 0
            self._k.append(k)
            self._v.append(v)
            self._kv_arrays.append((ka.reshape(self.n_ctx, self.hidden),
                                    va.reshape(self.hidden, self.n_ctx)))  # fmt: skip

    # -- graphs

    def _build(self, rows: int, keys: int, output: bool) -> _Graph:
        """A graph over ROWS new rows attending to KEYS cache rows (the rows included); its
        inputs and output are NumPy views of ggml's buffers."""
        b, h = self._b, self.hidden
        nodes = _NODES * (self.layers + 2)
        ctx, graph = libggml.new_graph(nodes)
        alloc = None
        try:

            def new_input(kind: int, *ne: int) -> int:
                t = (b.ggml_new_tensor_1d(ctx, kind, ne[0]) if len(ne) == 1
                     else b.ggml_new_tensor_2d(ctx, kind, *ne))  # fmt: skip
                b.ggml_set_input(t)
                return t

            x = new_input(GGML_F32, h, rows)
            pos = new_input(GGML_I32, rows)
            mask = new_input(GGML_F32, keys, rows)
            k_rows = new_input(GGML_I64, rows)
            v_rows = new_input(GGML_I64, h * rows)
            ops = _Ops(b, ctx, self._w, self.eps)
            cur = x
            for i in range(self.layers):
                cur = self._layer(ops, graph, cur, i, rows, keys, (pos, mask, k_rows, v_rows))
            out = None
            if output:
                out = ops.norm(b.ggml_view_1d(ctx, cur, h, (rows - 1) * h * 4), "output_norm")
                b.ggml_set_output(out)
            b.ggml_build_forward_expand(graph, cur if out is None else out)
            alloc = libggml.allocate(graph)
            view = libggml.tensor_array
            return _Graph(ctx, alloc, graph, view(x, h * rows).reshape(rows, h),
                          view(pos, rows, np.int32), view(mask, keys * rows).reshape(rows, keys),
                          view(k_rows, rows, np.int64),
                          view(v_rows, h * rows, np.int64).reshape(rows, h),
                          None if out is None else view(out, h))  # fmt: skip
        except BaseException:
            if alloc:
                b.ggml_gallocr_free(alloc)
            b.ggml_free(ctx)
            raise

    def _layer(self, ops: _Ops, graph: int, cur: int, i: int, rows: int, keys: int,
               inputs: tuple[int, int, int, int]) -> int:  # fmt: skip
        """Block I over CUR [hidden, rows]: its rows' keys and values written to the cache at
        K_ROWS / V_ROWS, then attention over the first KEYS cached rows (MASK)."""
        b, ctx = self._b, ops.ctx
        h, hd, n_head, n_ctx = self.hidden, self.head_dim, self.heads, self.n_ctx
        pos, mask, k_rows, v_rows = inputs
        cell, f4 = np.dtype(self._kv_dtype).itemsize, 4  # a cached value's bytes, a float's
        blk = f"blk.{i}"
        qkv = ops.linear(ops.norm(cur, f"{blk}.attn_norm"), f"{blk}.attn_qkv")  # [3h, rows]
        row = 3 * h * f4
        rope = (pos, None, hd, _ROPE_NEOX, 0, self.rope_base, 1.0, 0.0, 1.0, 32.0, 1.0)
        q = b.ggml_rope_ext(ctx, b.ggml_view_3d(ctx, qkv, hd, n_head, rows, hd * f4, row, 0),
                            *rope)  # fmt: skip
        k = b.ggml_rope_ext(ctx, b.ggml_view_3d(ctx, qkv, hd, n_head, rows, hd * f4, row,
                                                h * f4), *rope)  # fmt: skip
        v = b.ggml_view_2d(ctx, qkv, h, rows, row, 2 * h * f4)
        # the cache writes come first: ggml runs nodes in the order they are added
        b.ggml_build_forward_expand(graph, b.ggml_set_rows(
            ctx, self._k[i], b.ggml_reshape_2d(ctx, k, h, rows), k_rows))  # fmt: skip
        v_flat = b.ggml_reshape_2d(ctx, b.ggml_cont_2d(ctx, v, h, rows), 1, h * rows)
        b.ggml_build_forward_expand(graph, b.ggml_set_rows(ctx, self._v[i], v_flat, v_rows))
        k_all = b.ggml_view_3d(ctx, self._k[i], hd, keys, n_head, h * cell, hd * cell, 0)
        v_all = b.ggml_view_3d(ctx, self._v[i], keys, hd, n_head, n_ctx * cell,
                               hd * n_ctx * cell, 0)  # fmt: skip
        scores = b.ggml_mul_mat(ctx, k_all, b.ggml_permute(ctx, q, 0, 2, 1, 3))
        scores = b.ggml_soft_max_ext(ctx, scores, mask, 1.0 / float(np.sqrt(hd)), 0.0)
        mixed = b.ggml_mul_mat(ctx, v_all, scores)  # [hd, rows, head]
        mixed = b.ggml_cont_2d(ctx, b.ggml_permute(ctx, mixed, 0, 2, 1, 3), h, rows)
        cur = b.ggml_add(ctx, cur, ops.linear(mixed, f"{blk}.attn_output"))
        up = b.ggml_gelu(ctx, ops.linear(ops.norm(cur, f"{blk}.ffn_norm"), f"{blk}.ffn_up"))
        return b.ggml_add(ctx, cur, ops.linear(up, f"{blk}.ffn_down"))

    def _free(self, graph: _Graph) -> None:
        self._b.ggml_gallocr_free(graph.alloc)
        self._b.ggml_free(graph.ctx)

    def _run(self, graph: _Graph, rows: np.ndarray, past: int) -> None:
        n, keys = rows.shape[0], graph.mask.shape[1]
        graph.x[:] = rows
        at = np.arange(past, past + n)
        graph.pos[:] = at
        graph.k_rows[:] = at
        graph.v_rows[:] = np.arange(self.hidden)[None, :] * self.n_ctx + at[:, None]
        graph.mask[:] = np.where(np.arange(keys)[None, :] <= at[:, None], 0.0, -np.inf)
        status = self._b.ggml_backend_graph_compute(self._backend, graph.graph)
        if status != 0:
            raise ToolError(f"ggml could not compute the global transformer (status {status})")

    def _room(self, rows: int) -> None:
        if self.n_past + rows > self.n_ctx:
            raise InputError(f"the sequence needs {self.n_past + rows} positions but n_ctx is "
                             f"{self.n_ctx}",
                             hint="raise n_ctx in the config, or shorten the text / reference")

    # -- work

    def reset(self) -> None:
        self.n_past = 0

    def _feed(self, embeds: np.ndarray, output: bool) -> np.ndarray | None:
        embeds = np.asarray(embeds, dtype=np.float32)
        if not output and embeds.size == 0:
            return None
        if embeds.ndim != 2 or embeds.shape[1] != self.hidden or embeds.shape[0] == 0:
            raise InputError(f"prompt embeddings have shape {embeds.shape}, need (S, "
                             f"{self.hidden})")  # fmt: skip
        self._room(embeds.shape[0])
        out = None
        for start in range(0, embeds.shape[0], PREFILL_ROWS):
            part = embeds[start : start + PREFILL_ROWS]
            last = output and start + PREFILL_ROWS >= embeds.shape[0]
            graph = self._build(part.shape[0], self.n_past + part.shape[0], last)
            try:
                self._run(graph, part, self.n_past)
                if last:
                    out = graph.out.copy()
            finally:
                self._free(graph)
            self.n_past += part.shape[0]
        return out

    def fill(self, embeds: np.ndarray) -> None:
        """Feed rows into the cache and output nothing (a prompt's shared beginning)."""
        self._feed(embeds, False)

    def prefill(self, embeds: np.ndarray) -> np.ndarray:
        """Feed the prompt's (S, hidden) rows; the last row's final-norm hidden state."""
        return self._feed(embeds, True)

    def step(self, row: np.ndarray) -> np.ndarray:
        """Feed one (hidden,) row; its final-norm hidden state (a buffer the next step at the
        same key bucket overwrites)."""
        self._room(1)
        keys = min(-(-(self.n_past + 1) // BUCKET) * BUCKET, self.n_ctx)
        graph = self._steps.pop(keys, None)
        if graph is None:
            graph = self._build(1, keys, True)
            while len(self._steps) >= STEP_GRAPHS_KEPT:
                self._free(self._steps.pop(next(iter(self._steps))))
        self._steps[keys] = graph  # the most recent last
        self._run(graph, row.reshape(1, -1), self.n_past)
        self.n_past += 1
        return graph.out

    def save(self) -> GlobalState:
        rows = self.n_past
        return GlobalState(rows, [k[:rows].copy() for k, _ in self._kv_arrays],
                           [v[:, :rows].copy() for _, v in self._kv_arrays])  # fmt: skip

    def load(self, state: GlobalState) -> None:
        for (k, v), ks, vs in zip(self._kv_arrays, state.keys, state.values, strict=True):
            k[: state.rows] = ks
            v[:, : state.rows] = vs
        self.n_past = state.rows

    def close(self) -> None:
        for graph in getattr(self, "_steps", {}).values():
            self._free(graph)
        self._steps = {}
        if getattr(self, "_backend", None):
            self._b.ggml_backend_free(self._backend)
        self._backend = None
        if getattr(self, "_ctx", None):
            self._b.ggml_free(self._ctx)
        self._ctx = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have unloaded ctypes
            pass
