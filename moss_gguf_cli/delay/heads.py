"""Audio heads: one stacked (n_vq × audio_rows) × hidden matrix, applied to the hidden state.

Per generation step the whole stack is read once (32 × 1025 × 4096 on the real
model), so the step cost is memory bandwidth: 537 MB as float32, 268 MB as float16.
NumPy has no fast float16 matrix-vector product (it is ~20× slower than float32
BLAS), so two backends:

- ``numpy`` (also ``torch``): float32 stack, BLAS sgemv, the numerics of
  upstream's backend and the Hugging Face reference. Always available.
- ``ggml-f16`` (``ggml``): float16 stack (and a float16-rounded hidden state) in a ggml
  context of the libggml that llama-cpp-python ships, multiplied by ggml's CPU kernels:
  half the bytes per step; near-ties in greedy decoding can flip (docs/memory-floor.md
  gives the error against float32: 0.02 %). ``auto`` (the default) is this one, measured
  the faster of the two against the step's memory floor (docs/memory-floor.md), and numpy
  where ggml does not load. Several hidden states go in one product (at least 2
  columns for the "identical" width: a row's logits the same bits alone or batched).
  Reached through ctypes; no compilation; falls back to numpy when it does not load.
The pad code's column is set to −inf, so it is never sampled.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..native import libggml
from ..native.cpu_features import physical_cores
from .embeddings import open_table

log = logging.getLogger(__name__)

HEAD_NAME = "lm_head_audio_{:02d}.npy"


def head_shape(lm_head_dir: Path) -> tuple[int, int]:
    """(rows, hidden) of the first audio head."""
    return tuple(open_table(Path(lm_head_dir) / HEAD_NAME.format(0)).shape)  # type: ignore[return-value]


def fill_stacked(lm_head_dir: Path, n_vq: int, audio_rows: int, out: np.ndarray) -> None:
    """Copy the n_vq audio heads into OUT (n_vq * audio_rows, hidden), casting to its dtype."""
    lm_head_dir = Path(lm_head_dir)
    hidden = out.shape[1]
    for k in range(n_vq):
        path = lm_head_dir / HEAD_NAME.format(k)
        table = open_table(path)
        if table.shape != (audio_rows, hidden):
            raise InputError(
                f"audio head {k} has shape {table.shape}, expected ({audio_rows}, {hidden})",
                path=path,
            )
        block = out[k * audio_rows : (k + 1) * audio_rows]
        block[...] = table
        if not np.all(np.isfinite(block)):
            raise InputError("the audio head holds inf/NaN values", path=path)


def load_stacked(lm_head_dir: Path, n_vq: int, audio_rows: int, dtype) -> np.ndarray:
    """The n_vq audio heads as one (n_vq * audio_rows, hidden) array of DTYPE."""
    _, hidden = head_shape(lm_head_dir)
    stacked = np.empty((n_vq * audio_rows, hidden), dtype=dtype)
    fill_stacked(lm_head_dir, n_vq, audio_rows, stacked)
    return stacked


class AudioHeads:
    """audio logits (stop − start, audio_rows) for codebooks [start, stop) of a hidden state."""

    def __init__(
        self,
        lm_head_dir: Path,
        n_vq: int,
        audio_rows: int,
        pad_code: int,
        backend: str = "auto",
        n_threads: int = 0,
        max_width: int = 1,
    ):
        self.n_vq = n_vq
        self.rows = audio_rows
        self.pad = pad_code
        self._ggml: _GgmlMatVec | None = None
        if backend == "torch":
            log.info("heads_backend torch: float32 heads in NumPy (no torch heads here)")
        if backend in ("ggml-f16", "ggml", "auto"):
            try:
                _, hidden = head_shape(lm_head_dir)
                # every core: one row is memory-bound, but several are compute-bound (on
                # 2 idle cores, 1 thread vs 2: 11.5 vs 8.9 ms a row, 21.3 vs 11.5 ms for 4)
                threads = n_threads or physical_cores()
                ggml = _GgmlMatVec(n_vq * audio_rows, hidden, threads, max_width)
                try:  # straight into ggml's buffer: no second copy of the stack
                    fill_stacked(lm_head_dir, n_vq, audio_rows, ggml.weights)
                except BaseException:
                    ggml.close()
                    raise
                self._ggml = ggml
            except _GgmlUnavailable as exc:
                log.warning("ggml heads unavailable (%s); using numpy float32", exc)
        self._wide: _GgmlMatVec | None = None
        if self._ggml is None:
            self._stacked = self._load_float32(lm_head_dir, max_width, n_threads)
            self.hidden = int(self._stacked.shape[1])
            self._out = np.empty(n_vq * audio_rows, dtype=np.float32)
            self.backend = "numpy"
        else:
            self.hidden = self._ggml.cols
            self.backend = "ggml"

    def _load_float32(self, lm_head_dir: Path, max_width: int, n_threads: int) -> np.ndarray:
        """The float32 stack. For an engine that steps several rows it lives in a ggml
        buffer: one row is still NumPy's sgemv on it (the same bits), several are one ggml
        product (tinyBLAS reads the stack once for all; NumPy's sgemm, even head by head,
        measured 3-5x slower at 4 rows on a loaded 2-core machine: docs/memory-floor.md)."""
        if max_width > 1:
            try:
                _, hidden = head_shape(lm_head_dir)
                threads = n_threads or physical_cores()
                self._wide = _GgmlMatVec(self.n_vq * self.rows, hidden, threads, max_width,
                                         np.float32)  # fmt: skip
                fill_stacked(lm_head_dir, self.n_vq, self.rows, self._wide.weights)
                return self._wide.weights
            except _GgmlUnavailable as exc:
                log.warning("ggml unavailable (%s); several rows' heads in NumPy", exc)
        return load_stacked(lm_head_dir, self.n_vq, self.rows, np.float32)

    def logits(self, hidden: np.ndarray, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Float32 logits, pad column −inf. The array is reused by the next call."""
        stop = self.n_vq if stop is None else stop
        if self._ggml is not None:
            flat = self._ggml(hidden)
            out = flat.reshape(self.n_vq, self.rows)[start:stop]
        else:
            # always the whole stack, even when fewer codebooks are sampled: BLAS splits a
            # matrix-vector product into blocks and threads by its size, so the rows of a
            # slice can differ in the last bit from the same rows of the full product —
            # and the full product is what upstream's backend computes every step
            np.matmul(self._stacked, hidden, out=self._out)
            out = self._out.reshape(self.n_vq, self.rows)[start:stop]
        out[:, self.pad] = -np.inf
        return out

    def logits_rows(self, hidden: np.ndarray, width: int) -> np.ndarray:
        """(n, n_vq, audio_rows) logits of n hidden states (n ≤ WIDTH), pad column −inf.

        Always WIDTH rows wide (zeros after the n given): BLAS picks its kernels and blocks
        by the shape, so a fixed shape keeps a row's bits independent of the other rows.
        WIDTH 1 is `logits`' matrix-vector product. A fresh array."""
        n = hidden.shape[0]
        if self._ggml is not None:  # a row's bits do not depend on the width (_GgmlMatVec)
            out = self._ggml(hidden, width).reshape(n, self.n_vq, self.rows).copy()
            out[:, :, self.pad] = -np.inf
            return out
        if width == 1:
            return self.logits(hidden[0]).copy().reshape(1, self.n_vq, self.rows)
        if self._wide is not None:  # float32, the same bits at any width from 2 on
            out = self._wide(hidden, width).reshape(n, self.n_vq, self.rows).copy()
            out[:, :, self.pad] = -np.inf
            return out
        columns = np.zeros((self.hidden, width), dtype=np.float32)
        columns[:, :n] = hidden.T
        flat = np.empty((self.n_vq * self.rows, width), dtype=np.float32)
        # one head at a time: BLAS packs a block it can keep in cache instead of the whole
        # stack (measured on the real dims, 4 wide: 40 ms against 55 ms in one product)
        for k in range(self.n_vq):
            block = slice(k * self.rows, (k + 1) * self.rows)
            np.matmul(self._stacked[block], columns, out=flat[block])
        out = np.ascontiguousarray(flat[:, :n].T).reshape(n, self.n_vq, self.rows)
        out[:, :, self.pad] = -np.inf
        return out

    def close(self) -> None:
        if self._wide is not None:
            self._stacked = None  # a view of the buffer freed now
        for product in (self._ggml, self._wide):
            if product is not None:
                product.close()
        self._ggml = self._wide = None


# ---------------------------------------------------------------- ggml via ctypes


_GgmlUnavailable = libggml.GgmlUnavailable
_InitParams = libggml.InitParams
_GGML_TYPE_F32 = 0
_GGML_TYPE_F16 = 1


def _load_ggml():
    g = libggml.load()
    return g.base, g.cpu


class _GgmlMatVec:
    """Y = W @ X with W float16 or float32 (rows × cols) held by ggml, X (n, cols) and Y
    float32.

    Fill `weights` (a view of ggml's buffer) before the first call. One graph per column
    count up to MAX_WIDTH, built on first use. ggml multiplies one column with its vector
    dot product and two or more with tinyBLAS, whose sums for a column do not depend on the
    columns beside it: asked for at least 2 columns (zeros beside), a row's logits are the
    same bits alone or in any batch (the engine's "identical" width)."""

    def __init__(self, rows: int, cols: int, n_threads: int, max_width: int = 1,
                 dtype=np.float16):  # fmt: skip
        base, cpu = _load_ggml()
        dtype = np.dtype(dtype)
        kind = _GGML_TYPE_F16 if dtype == np.float16 else _GGML_TYPE_F32
        if cols % 32:  # ggml's f16 dot kernels want whole blocks; fall back instead
            raise _GgmlUnavailable(f"hidden size {cols} is not a multiple of 32")
        self._base, self._cpu = base, cpu
        self.rows, self.cols, self.threads = rows, cols, n_threads
        self.max_width = max(2, max_width)
        io = sum((cols + rows) * 4 * w for w in range(1, self.max_width + 1))
        size = rows * cols * dtype.itemsize + io + 4 * self.max_width * base.ggml_tensor_overhead()
        size += self.max_width * base.ggml_graph_overhead()
        self._ctx = base.ggml_init(_InitParams(size, None, False))
        # ggml_graph_compute_with_ctx allocates its work buffer (the f16 copy of x) in the
        # context it is given on every call; a context of its own, reset before each call,
        # keeps that from filling the weights' context after a few hundred steps
        work = cols * 2 * 64 * self.max_width + (1 << 20) + base.ggml_tensor_overhead()
        self._work = base.ggml_init(_InitParams(work, None, False))
        if not self._ctx or not self._work:
            raise _GgmlUnavailable("ggml_init failed (out of memory?)")
        self._w = base.ggml_new_tensor_2d(self._ctx, kind, cols, rows)
        nbytes = rows * cols * dtype.itemsize
        buffer = (ctypes.c_uint8 * nbytes).from_address(base.ggml_get_data(self._w))
        self.weights = np.frombuffer(buffer, dtype=dtype).reshape(rows, cols)
        self._graphs: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}

    def _graph(self, width: int) -> tuple[int, np.ndarray, np.ndarray]:
        if width not in self._graphs:
            base, cols, rows = self._base, self.cols, self.rows
            x = base.ggml_new_tensor_2d(self._ctx, _GGML_TYPE_F32, cols, width)
            y = base.ggml_mul_mat(self._ctx, self._w, x)
            graph = base.ggml_new_graph(self._ctx)
            base.ggml_build_forward_expand(graph, y)
            xs = (ctypes.c_float * (cols * width)).from_address(base.ggml_get_data(x))
            ys = (ctypes.c_float * (rows * width)).from_address(base.ggml_get_data(y))
            self._graphs[width] = (graph, np.ctypeslib.as_array(xs).reshape(width, cols),
                                   np.ctypeslib.as_array(ys).reshape(width, rows))  # fmt: skip
        return self._graphs[width]

    def __call__(self, x: np.ndarray, width: int = 1) -> np.ndarray:
        """X (cols,) → (rows,); X (n, cols) → (n, rows), in a product WIDTH columns wide
        (at least n). A view of ggml's buffer, reused by the next call."""
        if self._ctx is None:
            raise RuntimeError("closed")
        rows = np.atleast_2d(x)
        n = rows.shape[0]
        width = max(n, width)
        if width > self.max_width:
            raise ValueError(f"{width} columns, at most {self.max_width}")
        graph, xs, ys = self._graph(width)
        xs[:n] = rows
        xs[n:] = 0.0
        self._base.ggml_reset(self._work)
        status = self._cpu.ggml_graph_compute_with_ctx(self._work, graph, self.threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {status}")
        return ys[0] if x.ndim == 1 else ys[:n]

    def close(self) -> None:
        if self._ctx is not None:
            self._base.ggml_free(self._ctx)
            self._base.ggml_free(self._work)
            self._ctx = self._work = None
            self._graphs.clear()
            self.weights = None  # type: ignore[assignment]

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have unloaded ctypes
            pass
