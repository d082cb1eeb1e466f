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

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..gguf.read import GgufFormatError, header_input_error, read_gguf
from ..graphs import (
    CpuBackend,
    GgmlType,
    Graph,
    Owner,
    Rope,
    RopeMode,
    Tensor,
    Weights,
    attention,
    causal_mask,
    layer_norm,
    linear,
    merge_heads,
    overhead,
    rope,
    tensor_bytes,
)
from ..native import libggml

BUCKET = 32  # a step's keys are read rounded up to this (masked); one graph per bucket
STEP_GRAPHS_KEPT = 8  # a 30 s answer spans ~12 buckets: older graphs are rebuilt (~1 ms)
PREFILL_ROWS = 128  # a prompt is computed this many rows at a time
_HINT = "rerun `moss-gguf all` on the model"
_NODES = 48  # a layer adds ~40 nodes and leaves
_KV_TYPES = {"F16": GgmlType.F16, "F32": GgmlType.F32}


@dataclass(frozen=True)
class GlobalState:
    """A sequence's first ROWS key/value rows, per layer (`save`/`load`)."""

    rows: int
    keys: list[np.ndarray]
    values: list[np.ndarray]


@dataclass(frozen=True)
class _Inputs:
    """A graph's per-row inputs, as its layers read them."""

    pos: Tensor  # [rows] int32: each row's position
    mask: Tensor  # [keys, rows]: 0 where a row sees a key, -inf where not
    k_rows: Tensor  # [rows] int64: the K cache rows written
    v_rows: Tensor  # [hidden × rows] int64: the V cache elements written (stored transposed)


class GgmlGlobal(Owner):
    """The global transformer of one Nano folder: `prefill`/`fill` a prompt, `step` a row,
    `save`/`load` a prompt's shared rows. One sequence, N_CTX rows."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int, kv_type: str = "F16"):
        libggml.load()  # a missing ggml says so before the file is read
        # float16 keys and values, as llama.cpp keeps them; F32 holds the file's own math
        self._kv_type = _KV_TYPES[kv_type]
        self.path, self.n_ctx, self.n_past = Path(gguf), n_ctx, 0
        self._weights: Weights | None = None
        self._backend: CpuBackend | None = None
        self._steps: dict[int, Graph] = {}
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
            self._backend = CpuBackend(threads)
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
            if info.type_name not in GgmlType.__members__:
                raise InputError(f"tensor {name} is {info.type_name}, a type ggml does not "
                                 "compute with", path=self.path, hint=_HINT)  # fmt: skip
            infos.append(info)
        h, n_ctx, kind = self.hidden, self.n_ctx, self._kv_type
        kv_bytes = 2 * tensor_bytes(kind, (h, n_ctx))  # K and V
        size = sum(i.nbytes for i in infos) + self.layers * kv_bytes
        size += overhead(len(infos) + 2 * self.layers + 8)
        self._weights = w = Weights(size)
        self._w: dict[str, Tensor] = {}
        with open(self.path, "rb") as f:
            for info in infos:
                t = w.new(info.name, GgmlType[info.type_name], tuple(info.dims))
                if t.nbytes != info.nbytes:
                    raise InputError(f"tensor {info.name} holds {info.nbytes} bytes, ggml "
                                     f"needs {t.nbytes}", path=self.path, hint=_HINT)
                f.seek(header.abs_offset(info))
                if f.readinto(w.raw(t)) != info.nbytes:
                    raise InputError(f"tensor {info.name} is cut short", path=self.path,
                                     hint=_HINT)  # fmt: skip
                self._w[info.name] = t
        # K: a row of HIDDEN a position; V transposed (a channel's positions contiguous), so
        # both attention products read contiguous rows. Zeroed: masked keys are multiplied
        # by zero weights, and unset memory may hold NaN.
        self._k, self._v, self._kv_arrays = [], [], []
        for i in range(self.layers):
            k = w.zeros(f"blk.{i}.cache_k", kind, (h, n_ctx))
            v = w.zeros(f"blk.{i}.cache_v", kind, (1, h * n_ctx))
            self._k.append(k)
            self._v.append(v)
            self._kv_arrays.append((w.array(k), w.array(v).reshape(h, n_ctx)))

    # -- graphs

    def _build(self, rows: int, keys: int, output: bool) -> Graph:
        """A graph over ROWS new rows attending to KEYS cache rows (the rows included); its
        inputs (x, pos, mask, k_rows, v_rows) and output (output_norm) are NumPy views."""
        h, f32 = self.hidden, GgmlType.F32
        g = Graph(_NODES * (self.layers + 2), backend=self._backend,
                  label="the global transformer")  # fmt: skip
        try:
            cur = g.input("x", f32, (h, rows))
            inputs = _Inputs(g.input("pos", GgmlType.I32, (rows,)),
                             g.input("mask", f32, (keys, rows)),
                             g.input("k_rows", GgmlType.I64, (rows,)),
                             g.input("v_rows", GgmlType.I64, (h * rows,)))  # fmt: skip
            for i in range(self.layers):
                cur = self._layer(g, cur, i, rows, keys, inputs)
            if output:
                last = g.view(cur, (h,), offset=(rows - 1) * h, name="last_row")
                cur = g.output(self._norm(g, last, "output_norm"))
            g.expand(cur)
            g.allocate()
            return g
        except BaseException:
            g.close()
            raise

    def _norm(self, g: Graph, x: Tensor, name: str) -> Tensor:
        w = self._w
        return layer_norm(g, x, weight=w[f"{name}.weight"], bias=w[f"{name}.bias"],
                          eps=self.eps, name=name)  # fmt: skip

    def _linear(self, g: Graph, x: Tensor, name: str) -> Tensor:
        return linear(g, x, self._w[f"{name}.weight"], self._w[f"{name}.bias"], name=name)

    def _layer(self, g: Graph, cur: Tensor, i: int, rows: int, keys: int,
               inputs: _Inputs) -> Tensor:  # fmt: skip
        """Block I over CUR [hidden, rows]: its rows' keys and values written to the cache at
        K_ROWS / V_ROWS, then attention over the first KEYS cached rows (MASK)."""
        h, hd, n_head, n_ctx = self.hidden, self.head_dim, self.heads, self.n_ctx
        blk = f"blk.{i}"
        qkv = self._linear(g, self._norm(g, cur, f"{blk}.attn_norm"), f"{blk}.attn_qkv")
        rotary = Rope(n_dims=hd, mode=RopeMode.NEOX, freq_base=self.rope_base)
        # qkv [3h, rows] holds q, k, v one after another in each row: q and k as [hd, head, row]
        q, k = (rope(g, g.view(qkv, (hd, n_head, rows), offset=j * h, steps=(hd, 3 * h),
                                name=f"{blk}.{part}"), inputs.pos, rotary,
                     name=f"{blk}.{part}_rope") for j, part in enumerate(("q", "k")))  # fmt: skip
        v = g.view(qkv, (h, rows), offset=2 * h, name=f"{blk}.v")
        # the cache writes come first: ggml runs nodes in the order they are added
        k_flat = g.reshape(k, (h, rows), name=f"{blk}.k_flat")
        g.expand(g.set_rows(self._k[i], k_flat, inputs.k_rows, name=f"{blk}.k_write"))
        v_flat = g.reshape(g.cont(v, (h, rows), name=f"{blk}.v_cont"), (1, h * rows),
                           name=f"{blk}.v_flat")  # fmt: skip
        g.expand(g.set_rows(self._v[i], v_flat, inputs.v_rows, name=f"{blk}.v_write"))
        # the first KEYS positions, split into heads: K [hd, key, head], V^T [key, hd, head]
        k_all = g.view(self._k[i], (hd, keys, n_head), steps=(h, hd), name=f"{blk}.keys")
        v_all = g.view(self._v[i], (keys, hd, n_head), steps=(n_ctx, hd * n_ctx),
                       name=f"{blk}.values")  # fmt: skip
        q = g.permute(q, (0, 2, 1, 3), name=f"{blk}.q_by_head")  # [hd, row, head]
        mixed = attention(g, q, k_all, v_all, mask=inputs.mask, scale=1.0 / float(np.sqrt(hd)),
                          name=f"{blk}.attn")  # fmt: skip
        mixed = merge_heads(g, mixed, name=f"{blk}.attn_merged")
        cur = g.add(cur, self._linear(g, mixed, f"{blk}.attn_output"), name=f"{blk}.attn_residual")
        up = g.gelu(self._linear(g, self._norm(g, cur, f"{blk}.ffn_norm"), f"{blk}.ffn_up"),
                    name=f"{blk}.ffn_gelu")  # fmt: skip
        return g.add(cur, self._linear(g, up, f"{blk}.ffn_down"), name=f"{blk}.out")

    def _run(self, graph: Graph, rows: np.ndarray, past: int) -> None:
        inputs = graph.inputs
        n, keys = rows.shape[0], inputs["mask"].shape[1]
        inputs["x"][:] = rows
        at = np.arange(past, past + n)
        inputs["pos"][:] = at
        inputs["k_rows"][:] = at
        # V is stored transposed: channel c of position p is element c × n_ctx + p
        inputs["v_rows"].reshape(n, self.hidden)[:] = (np.arange(self.hidden)[None, :] * self.n_ctx
                                                       + at[:, None])  # fmt: skip
        inputs["mask"][:] = causal_mask(at, keys)
        graph.compute()

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
                    out = graph.outputs["output_norm"].copy()
            finally:
                graph.close()
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
                self._steps.pop(next(iter(self._steps))).close()
        self._steps[keys] = graph  # the most recent last
        self._run(graph, row.reshape(1, -1), self.n_past)
        self.n_past += 1
        return graph.outputs["output_norm"]

    def save(self) -> GlobalState:
        rows = self.n_past
        return GlobalState(rows, [k[:rows].copy() for k, _ in self._kv_arrays],
                           [v[:, :rows].copy() for _, v in self._kv_arrays])  # fmt: skip

    def load(self, state: GlobalState) -> None:
        for (k, v), ks, vs in zip(self._kv_arrays, state.keys, state.values, strict=True):
            k[: state.rows] = ks
            v[:, : state.rows] = vs
        self.n_past = state.rows

    def graphs(self) -> list[Graph]:
        """The step graphs kept (one a key bucket), to dump."""
        return list(self._steps.values())

    def close(self) -> None:
        for graph in getattr(self, "_steps", {}).values():
            graph.close()
        self._steps = {}
        self.release("_backend", "_weights")
