"""MOSS-TTS-Nano's local transformer and heads as ggml graphs, one a position, built once.

A frame is 17 dependent steps (sampling sits between them), so what a step costs beyond its
arithmetic is paid 17 times a frame. Through llama.cpp a step is a `llama_decode`: batch
checks, a graph built and scheduled, then the head as a NumPy product over float32 tables
that push the global transformer's weights out of the cache. Here each position's whole step
— the block over the positions before it, ln_f and that position's head — is one ggml graph
made when the engine loads, with the weights (matrices at the chosen type, heads included)
and the frame's key/value caches in one ggml context; a step writes its input row, computes
the graph, and reads the logits. The libggml is the one llama-cpp-python ships (the same
kernels llama.cpp runs), reached through ctypes; nothing is compiled.

Numerics are the block's (nano/local.LocalTransformer is the float32 reference): GPT-2's
tanh GELU, RoPE on interleaved pairs (ggml's "normal" mode), softmax over the cached
positions.
"""

from __future__ import annotations

import numpy as np

from ..native import libggml
from .config import TransformerDims

GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
GGML_I32 = 26
TYPE_IDS = {"F32": GGML_F32, "F16": GGML_F16, "Q8_0": GGML_Q8_0}
_ROPE_NORMAL = 0  # rotate adjacent pairs, as upstream's gpt2_decoder does
_NODES_A_LAYER = 64  # a block adds ~35 nodes; room to spare (ggml aborts past the size)


class GgmlLocal:
    """The local transformer and its heads in ggml. `head(p, x)`: position P's input row X
    (hidden,) through the block (after positions 0..P-1 of this frame) and ln_f, times head
    P; the logits are a view of ggml's buffer, reused by the next step at P. `reset` starts a
    frame (positions are overwritten in order)."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        dims: TransformerDims,
        layers: int,
        heads: list[np.ndarray],
        file_type: str = "Q8_0",
        threads: int = 1,
    ):
        g = libggml.load()
        self._base, self._cpu = g.base, g.cpu
        self.threads = max(1, threads)
        self.positions = len(heads)
        self._kind = TYPE_IDS[file_type]
        b = self._base
        h, n_head, p_max = dims.hidden, dims.heads, len(heads)
        matrices = [arrays[f"h.{i}.{n}.weight"] for i in range(layers)
                    for n in ("attn.c_attn", "attn.c_proj", "mlp.fc_in", "mlp.fc_out")]
        size = sum(self._bytes(m.shape) for m in matrices + heads)
        size += 4 * sum(a.size for a in arrays.values() if a.ndim == 1)
        size += layers * 2 * 4 * h * p_max + 4 * (h + n_head)
        # a graph's own tensors: a block makes ~21 rows of HIDDEN floats, 3 of INNER and the
        # attention's 2 per head a position, in ~40 tensors; then ln_f and the head
        per_graph = 4 * ((21 * h + 3 * dims.inner + 2 * n_head * p_max) * layers + 3 * h
                         + max(a.shape[0] for a in heads))  # fmt: skip
        tensors = _NODES_A_LAYER * (layers + 1)
        per_graph += tensors * (b.ggml_tensor_overhead() + 64)  # 64: each one's alignment
        self._nodes = tensors
        size += p_max * (per_graph + b.ggml_graph_overhead_custom(self._nodes, False))
        size += (16 * layers + 64) * (b.ggml_tensor_overhead() + 64) + (1 << 20)
        self._ctx = b.ggml_init(libggml.InitParams(size, None, False))
        # ggml_graph_compute_with_ctx takes its work buffer from the context it is given,
        # every call: a context of its own, reset before each step
        self._work = b.ggml_init(libggml.InitParams(4 * dims.inner * 8 + (1 << 20), None,
                                                    False))  # fmt: skip
        if not self._ctx or not self._work:
            self.close()
            raise libggml.GgmlUnavailable("ggml_init failed (out of memory?)")
        try:
            self._build(arrays, dims, layers, heads)
        except BaseException:
            self.close()
            raise

    def _type(self, cols: int) -> int:
        # Q8_0 packs rows in blocks of 32; a narrower row (tiny test models) stays float32
        return self._kind if self._kind != GGML_Q8_0 or cols % 32 == 0 else GGML_F32

    def _bytes(self, shape: tuple[int, ...]) -> int:
        rows, cols = shape
        return rows * int(self._base.ggml_row_size(self._type(cols), cols))

    def _matrix(self, values: np.ndarray) -> int:
        """A (rows, cols) float32 matrix as a ggml tensor [cols, rows] of the chosen type."""
        b = self._base
        rows, cols = values.shape
        kind = self._type(cols)
        t = b.ggml_new_tensor_2d(self._ctx, kind, cols, rows)
        src = np.ascontiguousarray(values, dtype=np.float32)
        if kind == GGML_F32:
            libggml.tensor_array(t, rows * cols)[:] = src.reshape(-1)
        else:
            b.ggml_quantize_chunk(kind, src.ctypes.data_as(libggml.FloatP), b.ggml_get_data(t),
                                  0, rows, cols, None)  # fmt: skip
        return t

    def _vector(self, values: np.ndarray) -> int:
        t = self._base.ggml_new_tensor_1d(self._ctx, GGML_F32, values.shape[0])
        libggml.tensor_array(t, values.shape[0])[:] = values
        return t

    def _build(self, arrays: dict[str, np.ndarray], dims: TransformerDims, layers: int,
               heads: list[np.ndarray]) -> None:  # fmt: skip
        b, ctx = self._base, self._ctx
        h, n_head, hd, p_max = dims.hidden, dims.heads, dims.head_dim, self.positions
        eps, f4 = float(dims.eps), 4
        w = []
        for i in range(layers):
            get = lambda n, i=i: arrays[f"h.{i}.{n}"]  # noqa: E731 - a short lookup
            w.append({
                "ln1": (self._vector(get("ln_1.weight")), self._vector(get("ln_1.bias"))),
                "ln2": (self._vector(get("ln_2.weight")), self._vector(get("ln_2.bias"))),
                "qkv": (self._matrix(get("attn.c_attn.weight")),
                        self._vector(get("attn.c_attn.bias"))),
                "proj": (self._matrix(get("attn.c_proj.weight")),
                         self._vector(get("attn.c_proj.bias"))),
                "up": (self._matrix(get("mlp.fc_in.weight")), self._vector(get("mlp.fc_in.bias"))),
                "down": (self._matrix(get("mlp.fc_out.weight")),
                         self._vector(get("mlp.fc_out.bias"))),
                # K as [hd, position, head]; V transposed, [position, hd, head], so that
                # both products of attention read contiguous rows
                "k": b.ggml_new_tensor_3d(ctx, GGML_F32, hd, p_max, n_head),
                "v": b.ggml_new_tensor_3d(ctx, GGML_F32, p_max, hd, n_head),
            })  # fmt: skip
        ln_f = (self._vector(arrays["ln_f.weight"]), self._vector(arrays["ln_f.bias"]))
        head_t = [self._matrix(m) for m in heads]
        self._input = b.ggml_new_tensor_1d(ctx, GGML_F32, h)
        self._x = libggml.tensor_array(self._input, h)
        scale = 1.0 / float(np.sqrt(hd))

        def norm(x: int, pair: tuple[int, int]) -> int:
            return b.ggml_add(ctx, b.ggml_mul(ctx, b.ggml_norm(ctx, x, eps), pair[0]), pair[1])

        def linear(x: int, pair: tuple[int, int]) -> int:
            return b.ggml_add(ctx, b.ggml_mul_mat(ctx, pair[0], x), pair[1])

        self._graphs, self._logits = [], []
        for p in range(p_max):
            pos = b.ggml_new_tensor_1d(ctx, GGML_I32, n_head)  # rope reads one per head row
            libggml.tensor_array(pos, n_head, np.int32)[:] = p
            graph = b.ggml_new_graph_custom(ctx, self._nodes, False)
            x = self._input
            for lw in w:
                qkv = linear(norm(x, lw["ln1"]), lw["qkv"])
                # q, k, v as [hd, 1, head]: one row a head, ne2 the heads (rope's positions)
                q, k = (b.ggml_view_3d(ctx, qkv, hd, 1, n_head, hd * f4, hd * f4, j * h * f4)
                        for j in range(2))  # fmt: skip
                v = b.ggml_view_3d(ctx, qkv, 1, hd, n_head, f4, hd * f4, 2 * h * f4)
                rope = (pos, None, hd, _ROPE_NORMAL, 0, float(dims.rope_base), 1.0, 0.0, 1.0,
                        32.0, 1.0)  # fmt: skip
                q = b.ggml_rope_ext(ctx, q, *rope)
                k = b.ggml_rope_ext(ctx, k, *rope)
                k_at = b.ggml_view_3d(ctx, lw["k"], hd, 1, n_head, hd * f4, hd * p_max * f4,
                                      p * hd * f4)  # fmt: skip
                v_at = b.ggml_view_3d(ctx, lw["v"], 1, hd, n_head, p_max * f4,
                                      p_max * hd * f4, p * f4)  # fmt: skip
                # the cache writes first: nodes run in the order they were added
                b.ggml_build_forward_expand(graph, b.ggml_cpy(ctx, k, k_at))
                b.ggml_build_forward_expand(graph, b.ggml_cpy(ctx, v, v_at))
                keys = b.ggml_view_3d(ctx, lw["k"], hd, p + 1, n_head, hd * f4,
                                      hd * p_max * f4, 0)  # fmt: skip
                values = b.ggml_view_3d(ctx, lw["v"], p + 1, hd, n_head, p_max * f4,
                                        p_max * hd * f4, 0)  # fmt: skip
                scores = b.ggml_soft_max_ext(ctx, b.ggml_mul_mat(ctx, keys, q), None, scale,
                                             0.0)  # fmt: skip
                attended = b.ggml_reshape_1d(ctx, b.ggml_mul_mat(ctx, values, scores), h)
                x = b.ggml_add(ctx, x, linear(attended, lw["proj"]))
                up = b.ggml_gelu(ctx, linear(norm(x, lw["ln2"]), lw["up"]))
                x = b.ggml_add(ctx, x, linear(up, lw["down"]))
            logits = b.ggml_mul_mat(ctx, head_t[p], norm(x, ln_f))
            b.ggml_build_forward_expand(graph, logits)
            self._graphs.append(graph)
            self._logits.append(libggml.tensor_array(logits, heads[p].shape[0]))

    def reset(self) -> None:
        pass  # each position's graph writes its own cache slot before reading 0..p

    def head(self, p: int, x: np.ndarray) -> np.ndarray:
        self._x[:] = x
        self._base.ggml_reset(self._work)
        status = self._cpu.ggml_graph_compute_with_ctx(self._work, self._graphs[p], self.threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {status}")
        return self._logits[p]

    def close(self) -> None:
        for name in ("_ctx", "_work"):
            ctx = getattr(self, name, None)
            if ctx:
                self._base.ggml_free(ctx)
            setattr(self, name, None)
        self._graphs, self._logits = [], []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have unloaded ctypes
            pass
