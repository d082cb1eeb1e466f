"""The text logits a step needs, and no others (ARCHITECTURE.md §10, "What a step reads").

While the model speaks, the delay machine allows two text ids (the gen slot and the delay
slot, `StepPlan.text_ids`); during the delay flush the text id is forced and needs no logit.
Only a step outside audio samples from the whole vocabulary, and for that one the backbone
runs llama.cpp's own head (tts/backbone.py, ``logits=True``). For the others, `TextHead`
multiplies the hidden states by just the rows asked for, read from the backbone GGUF's own
head (`output.weight`, or `token_embd.weight` when the model ties them) in its own type, with
ggml's CPU kernels, in a graph of its own: the product ggml makes of a weight row and a
hidden state does not depend on the other rows beside it (one dot product per element in the
type's own kernel: Q6_K × Q8_K, or tinyBLAS for F16/F32), so the logits are bit for bit the
ones llama.cpp computes for those ids (tests/test_text_head.py) while a step reads a few kB of
the head instead of all of it (0.5 GB in Q6_K on the real model).

The rows are read through a memory map of the GGUF, the one llama.cpp maps too: no copy of
the head is held, and the pages of the few rows read stay in the page cache.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import InputError
from ..gguf.read import GgufFormatError, header_input_error, read_gguf
from ..native import libggml

HEAD_TENSORS = ("output.weight", "token_embd.weight")  # the second when the model ties them
_GGML_TYPE_F32 = 0


class TextHead:
    """Logits of chosen text ids: `logits(hidden (n, cols), ids (k,))` → (n, k) float32."""

    def __init__(self, gguf: Path, n_threads: int = 1):
        gguf = Path(gguf)
        try:
            g = read_gguf(gguf)
        except GgufFormatError as exc:
            raise header_input_error(gguf, exc) from None
        info = next((g.tensors[n] for n in HEAD_TENSORS if n in g.tensors), None)
        if info is None or len(info.dims) != 2 or not g.in_file(info):
            raise InputError("the backbone GGUF has no complete text head (output.weight)",
                             path=gguf, hint="convert the model again")  # fmt: skip
        self.name = info.name
        self.type_name = info.type_name
        self.type_id = int(GGMLQuantizationType[info.type_name])
        self.cols, self.n_vocab = info.dims
        self.row_bytes = info.row_bytes
        self._rows = np.memmap(gguf, dtype=np.uint8, mode="r", offset=g.abs_offset(info),
                               shape=(self.n_vocab, self.row_bytes))  # fmt: skip
        self.threads = max(1, n_threads)
        self._ggml = libggml.load()

    def row_nbytes(self, count: int) -> int:
        """Bytes COUNT rows of the head take (what a step reads of it)."""
        return count * self.row_bytes

    def logits(self, hidden: np.ndarray, ids: np.ndarray, width: int = 1) -> np.ndarray:
        """(n, k) float32: row i column j is hidden[i] · head[ids[j]], as llama.cpp's head
        computes it in a batch of WIDTH rows (the product is that many columns wide, zeros
        after the n given: ggml takes its vector dot product for one column, tinyBLAS for
        more when the head is F16/F32/Q8_0, and the two sum in other orders). A fresh
        array."""
        given = np.ascontiguousarray(hidden, dtype=np.float32).reshape(-1, self.cols)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n, k = given.shape[0], ids.size
        hidden = np.zeros((max(n, width), self.cols), dtype=np.float32)
        hidden[:n] = given
        if k == 0 or n == 0:
            return np.empty((n, k), dtype=np.float32)
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise InputError(f"text id out of the head's {self.n_vocab} rows")
        base, cpu = self._ggml.base, self._ggml.cpu
        # the weights, the hidden states, the logits, and ggml's work buffer (the hidden
        # states in the type's dot-product partner, the graph: generous slack)
        size = (k * self.row_bytes + 3 * hidden.size * 4 + hidden.shape[0] * k * 4 + (4 << 20)
                + 8 * base.ggml_tensor_overhead() + base.ggml_graph_overhead())  # fmt: skip
        ctx = base.ggml_init(libggml.InitParams(size, None, False))
        if not ctx:
            raise MemoryError("ggml_init failed for the text head")
        try:
            w = base.ggml_new_tensor_2d(ctx, self.type_id, self.cols, k)
            x = base.ggml_new_tensor_2d(ctx, _GGML_TYPE_F32, self.cols, hidden.shape[0])
            y = base.ggml_mul_mat(ctx, w, x)
            graph = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(graph, y)
            _view(base, w, k * self.row_bytes, np.uint8)[:] = self._rows[ids].reshape(-1)
            _view(base, x, hidden.size, np.float32)[:] = hidden.reshape(-1)
            status = cpu.ggml_graph_compute_with_ctx(ctx, graph, self.threads)
            if status != 0:
                raise RuntimeError(f"ggml_graph_compute failed with status {status}")
            return _view(base, y, hidden.shape[0] * k, np.float32).reshape(-1, k)[:n].copy()
        finally:
            base.ggml_free(ctx)


def _view(base, tensor: int, count: int, dtype) -> np.ndarray:
    item = np.dtype(dtype).itemsize
    buffer = (ctypes.c_uint8 * (count * item)).from_address(base.ggml_get_data(tensor))
    return np.frombuffer(buffer, dtype=dtype)
