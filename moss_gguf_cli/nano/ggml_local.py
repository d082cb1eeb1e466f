"""MOSS-TTS-Nano's local transformer, heads and sampling as one ggml graph a frame.

A frame is 17 dependent steps, each sampled before the next can start. Run as 17 graphs with
sampling in Python between them, a frame paid 17 graph calls and 17 samplings of ~60-110 µs
(a NumPy call costs 2-4 µs on a small CPU), 2 ms of a 15 ms frame. Here the whole frame is one
graph: position 0 takes the global hidden state and its head decides continue or stop,
position 1 takes `wte[slot]`, position k + 2 takes audio table k's row of the code position
k + 1 picked (`ggml_get_rows` on the float32 table, shared with NumPy's, not copied); each
position's logits are penalised, filtered and sampled in the graph by the rule of
tts/sampling.pick_one, with one uniform draw a position given by the caller. One call a
frame returns the 17 picks. The libggml is the one llama-cpp-python ships (the kernels
llama.cpp runs), through ctypes; nothing is compiled.

The block's numerics are nano/local.LocalTransformer's (the float32 reference): GPT-2's tanh
GELU, RoPE on interleaved pairs (ggml's "normal" mode), softmax over the frame's positions.
Sampling is pick_one's in float32: repetition penalty over the codes this prompt already
produced, temperature, top-k, softmax, top-p over the mass strictly ahead, then the first
candidate whose cumulative mass exceeds draw × the kept mass (ties in logit order broken by
ggml's sort, not by id). A token can differ from float64 NumPy's only where a draw falls
within float32 rounding of a boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import NumericError, ToolError
from ..native import libggml
from ..tts.sampling import Sampler, SamplingParams
from .config import TransformerDims

GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
GGML_I32 = 26
TYPE_IDS = {"F32": GGML_F32, "F16": GGML_F16, "Q8_0": GGML_Q8_0}
_ROPE_NORMAL = 0  # rotate adjacent pairs, as upstream's gpt2_decoder does
_SORT_DESC = 1
_NODES_A_LAYER = 48  # a block adds ~35 nodes
_NODES_A_POSITION = 48  # input, ln_f, head, sampling (~30)
_ALIGN = 32  # ggml's tensor alignment
FRAME_GRAPHS_KEPT = 4  # one a sampling setting in use (a server's requests may differ)


@dataclass
class _Frame:
    ctx: int
    alloc: int
    graph: int
    hidden: np.ndarray  # position 0's input
    draws: np.ndarray  # a uniform a position
    stop: np.ndarray  # added to position 0's (continue, stop) logits: 0 or -inf
    picks: np.ndarray  # (positions,) int32: continue/stop, then the codes
    checks: np.ndarray  # a position's kept mass (greedy: its pick's logit): finite when sound
    logits: list[np.ndarray]  # each position's logits before sampling


def aligned(table: np.ndarray) -> np.ndarray:
    """TABLE as C-ordered float32 at an address ggml can place a tensor at (32 bytes): the
    array itself when it is, else a copy (give it the copy to keep one)."""
    table = np.ascontiguousarray(table, dtype=np.float32)
    if table.ctypes.data % _ALIGN == 0:
        return table
    raw = np.empty(table.size + _ALIGN // 4, np.float32)
    skip = (-raw.ctypes.data % _ALIGN) // 4
    out = raw[skip : skip + table.size].reshape(table.shape)
    out[:] = table
    return out


class GgmlLocal:
    """The local transformer, its heads and sampling in ggml. HEADS: position 0's (continue,
    stop) rows, then the n_vq audio tables (tied: also the next position's inputs, read in
    place: keep them alive); START: position 1's input row. `frame` runs one frame; `forget`
    starts a prompt (the penalty's memory of codes seen)."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        dims: TransformerDims,
        layers: int,
        heads: list[np.ndarray],
        start: np.ndarray,
        file_type: str = "Q8_0",
        threads: int = 1,
    ):
        g = libggml.load()
        self._b, self._cpu = g.base, g.cpu
        self.dims, self.layers = dims, layers
        self.positions = len(heads)
        self._kind = TYPE_IDS[file_type]
        self._ctx = self._tables_ctx = self._backend = None
        self._table_buffers: list[int] = []
        self._frames: dict[tuple[SamplingParams, SamplingParams], _Frame] = {}
        self.logits: list[np.ndarray] = []  # the last frame's, a position each
        self.last_draws = np.zeros(0, np.float32)  # the last frame's uniform draws
        b = self._b
        h, p_max = dims.hidden, self.positions
        matrices = [arrays[f"h.{i}.{n}.weight"] for i in range(layers)
                    for n in ("attn.c_attn", "attn.c_proj", "mlp.fc_in", "mlp.fc_out")]
        size = sum(self._bytes(m.shape) for m in matrices + heads)
        size += 4 * sum(a.size for a in arrays.values() if a.ndim == 1)
        size += layers * 2 * 4 * h * p_max + 4 * h + 4 * p_max * max(t.shape[0] for t in heads)
        size += (16 * layers + 2 * p_max + 16) * (b.ggml_tensor_overhead() + 64) + (1 << 20)
        self._ctx = b.ggml_init(libggml.InitParams(size, None, False))
        tables = p_max * (b.ggml_tensor_overhead() + 64)
        self._tables_ctx = b.ggml_init(libggml.InitParams(tables, None, True))
        if not self._ctx or not self._tables_ctx:
            self.close()
            raise libggml.GgmlUnavailable("ggml_init failed (out of memory?)")
        try:
            self._load(arrays, layers, heads, start)
            self._backend = self._cpu.ggml_backend_cpu_init()
            if not self._backend:
                raise ToolError("ggml cannot start its CPU backend")
            self._cpu.ggml_backend_cpu_set_n_threads(self._backend, max(1, threads))
        except BaseException:
            self.close()
            raise

    # -- weights

    def _type(self, cols: int) -> int:
        # Q8_0 packs rows in blocks of 32; a narrower row (tiny test models) stays float32
        return self._kind if self._kind != GGML_Q8_0 or cols % 32 == 0 else GGML_F32

    def _bytes(self, shape: tuple[int, ...]) -> int:
        rows, cols = shape
        return rows * int(self._b.ggml_row_size(self._type(cols), cols))

    def _matrix(self, values: np.ndarray) -> int:
        """A (rows, cols) float32 matrix as a ggml tensor [cols, rows] of the chosen type."""
        b = self._b
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
        t = self._b.ggml_new_tensor_1d(self._ctx, GGML_F32, values.shape[0])
        libggml.tensor_array(t, values.shape[0])[:] = values
        return t

    def _in_place(self, table: np.ndarray) -> int:
        """A float32 (rows, cols) NumPy table (aligned) as a ggml tensor over its memory."""
        b = self._b
        rows, cols = table.shape
        t = b.ggml_new_tensor_2d(self._tables_ctx, GGML_F32, cols, rows)
        buffer = b.ggml_backend_cpu_buffer_from_ptr(table.ctypes.data, table.nbytes)
        if not buffer:
            raise libggml.GgmlUnavailable("ggml cannot wrap a table's memory")
        self._table_buffers.append(buffer)
        if b.ggml_backend_tensor_alloc(buffer, t, table.ctypes.data) != 0:
            raise libggml.GgmlUnavailable("ggml cannot place a table in its memory")
        return t

    def _load(self, arrays: dict[str, np.ndarray], layers: int, heads: list[np.ndarray],
              start: np.ndarray) -> None:  # fmt: skip
        b, ctx = self._b, self._ctx
        dims = self.dims
        n_head, hd, p_max = dims.heads, dims.head_dim, self.positions
        self._w = []
        for i in range(layers):
            get = lambda n, i=i: arrays[f"h.{i}.{n}"]  # noqa: E731 - a short lookup
            self._w.append({
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
        self._ln_f = (self._vector(arrays["ln_f.weight"]), self._vector(arrays["ln_f.bias"]))
        self._heads = [self._matrix(m) for m in heads]
        self._vocab = [m.shape[0] for m in heads]
        self._start = self._vector(np.ascontiguousarray(start, dtype=np.float32))
        self._tables = [aligned(m) for m in heads[1:]]
        self._table_t = [self._in_place(m) for m in self._tables]
        # the repetition penalty's memory: 1.0 where audio position k + 1 produced a code
        width = max(self._vocab[1:])
        self._seen_t = b.ggml_new_tensor_2d(ctx, GGML_F32, width, p_max - 1)
        self.seen = libggml.tensor_array(self._seen_t, width * (p_max - 1)).reshape(p_max - 1,
                                                                                      width)
        self.seen[:] = 0.0

    # -- the frame graph

    def _build(self, text: SamplingParams, audio: SamplingParams) -> _Frame:
        b, dims = self._b, self.dims
        h, n_head, p_max = dims.hidden, dims.heads, self.positions
        nodes = p_max * (_NODES_A_LAYER * self.layers + _NODES_A_POSITION)
        ctx, graph = libggml.new_graph(nodes)
        alloc = None
        try:

            def new(kind: int, n: int, role=b.ggml_set_input) -> int:
                t = b.ggml_new_tensor_1d(ctx, kind, n)
                role(t)
                return t

            hidden, stop = new(GGML_F32, h), new(GGML_F32, 2)
            draws = new(GGML_F32, p_max, b.ggml_set_output)  # kept: _diagnose reads them
            picks = new(GGML_I32, p_max, b.ggml_set_output)
            checks = new(GGML_F32, p_max, b.ggml_set_output)
            f4 = 4
            # rope reads a position a head; written once, so kept as an output is (gallocr
            # reuses an input's memory after its last reader)
            positions = new(GGML_I32, n_head * p_max, b.ggml_set_output)
            logits_t, x = [], hidden
            for p in range(p_max):
                pos = b.ggml_view_1d(ctx, positions, n_head, p * n_head * 4)
                for lw in self._w:
                    x = self._block(ctx, graph, lw, x, pos, p)
                logits = b.ggml_mul_mat(ctx, self._heads[p], self._norm(ctx, x, self._ln_f))
                b.ggml_set_output(logits)
                logits_t.append(logits)
                draw = b.ggml_view_1d(ctx, draws, 1, p * f4)
                if p == 0:
                    pick, check = self._sample(ctx, b.ggml_add(ctx, logits, stop), text, draw)
                else:
                    seen = b.ggml_view_1d(ctx, self._seen_t, self._vocab[p],
                                          (p - 1) * self.seen.shape[1] * f4)
                    pick, check = self._sample(ctx, self._penalised(ctx, logits, seen, audio),
                                               audio, draw)  # fmt: skip
                b.ggml_build_forward_expand(graph, b.ggml_cpy(
                    ctx, pick, b.ggml_view_1d(ctx, picks, 1, p * 4)))  # fmt: skip
                b.ggml_build_forward_expand(graph, b.ggml_cpy(
                    ctx, check, b.ggml_view_1d(ctx, checks, 1, p * f4)))  # fmt: skip
                x = (self._start if p == 0 else b.ggml_reshape_1d(
                    ctx, b.ggml_get_rows(ctx, self._table_t[p - 1], pick), h))  # fmt: skip
            alloc = libggml.allocate(graph)

            def view(t: int, n: int, dtype=np.float32) -> np.ndarray:
                # an input no node reads (greedy sampling's draws) has no memory
                return (libggml.tensor_array(t, n, dtype) if b.ggml_get_data(t)
                        else np.zeros(n, dtype))  # fmt: skip

            frame = _Frame(ctx, alloc, graph, view(hidden, h), view(draws, p_max),
                           view(stop, 2), view(picks, p_max, np.int32), view(checks, p_max),
                           [view(t, n) for t, n in zip(logits_t, self._vocab, strict=True)])
            view(positions, n_head * p_max, np.int32)[:] = np.repeat(np.arange(p_max), n_head)
            return frame
        except BaseException:
            if alloc:
                b.ggml_gallocr_free(alloc)
            b.ggml_free(ctx)
            raise

    def _norm(self, ctx: int, x: int, pair: tuple[int, int]) -> int:
        b = self._b
        return b.ggml_add(ctx, b.ggml_mul(ctx, b.ggml_norm(ctx, x, float(self.dims.eps)),
                                          pair[0]), pair[1])  # fmt: skip

    def _linear(self, ctx: int, x: int, pair: tuple[int, int]) -> int:
        return self._b.ggml_add(ctx, self._b.ggml_mul_mat(ctx, pair[0], x), pair[1])

    def _block(self, ctx: int, graph: int, lw: dict, x: int, pos: int, p: int) -> int:
        """One block at position P over X [hidden]: its key and value written to the frame's
        caches at P, attention over positions 0..P."""
        b, dims = self._b, self.dims
        h, n_head, hd, p_max, f4 = dims.hidden, dims.heads, dims.head_dim, self.positions, 4
        qkv = self._linear(ctx, self._norm(ctx, x, lw["ln1"]), lw["qkv"])
        # q, k, v as [hd, 1, head]: one row a head, ne2 the heads (rope's positions)
        q, k = (b.ggml_view_3d(ctx, qkv, hd, 1, n_head, hd * f4, hd * f4, j * h * f4)
                for j in range(2))  # fmt: skip
        v = b.ggml_view_3d(ctx, qkv, 1, hd, n_head, f4, hd * f4, 2 * h * f4)
        rope = (pos, None, hd, _ROPE_NORMAL, 0, float(dims.rope_base), 1.0, 0.0, 1.0, 32.0, 1.0)
        q, k = b.ggml_rope_ext(ctx, q, *rope), b.ggml_rope_ext(ctx, k, *rope)
        k_at = b.ggml_view_3d(ctx, lw["k"], hd, 1, n_head, hd * f4, hd * p_max * f4,
                              p * hd * f4)  # fmt: skip
        v_at = b.ggml_view_3d(ctx, lw["v"], 1, hd, n_head, p_max * f4, p_max * hd * f4, p * f4)
        # the cache writes first: nodes run in the order they were added
        b.ggml_build_forward_expand(graph, b.ggml_cpy(ctx, k, k_at))
        b.ggml_build_forward_expand(graph, b.ggml_cpy(ctx, v, v_at))
        keys = b.ggml_view_3d(ctx, lw["k"], hd, p + 1, n_head, hd * f4, hd * p_max * f4, 0)
        values = b.ggml_view_3d(ctx, lw["v"], p + 1, hd, n_head, p_max * f4, p_max * hd * f4, 0)
        scores = b.ggml_soft_max_ext(ctx, b.ggml_mul_mat(ctx, keys, q), None,
                                     1.0 / float(np.sqrt(hd)), 0.0)  # fmt: skip
        attended = b.ggml_reshape_1d(ctx, b.ggml_mul_mat(ctx, values, scores), h)
        x = b.ggml_add(ctx, x, self._linear(ctx, attended, lw["proj"]))
        up = b.ggml_gelu(ctx, self._linear(ctx, self._norm(ctx, x, lw["ln2"]), lw["up"]))
        return b.ggml_add(ctx, x, self._linear(ctx, up, lw["down"]))

    def _penalised(self, ctx: int, logits: int, seen: int, params: SamplingParams) -> int:
        """pick_one's penalty: a seen code's logit / penalty where positive, × penalty
        otherwise, as logit + seen × (logit × (penalty - 1) + relu(logit) × (1/penalty -
        penalty))."""
        penalty = params.repetition_penalty
        if penalty == 1.0:
            return logits
        b = self._b
        change = b.ggml_add(ctx, b.ggml_scale(ctx, logits, penalty - 1.0),
                            b.ggml_scale(ctx, b.ggml_relu(ctx, logits), 1.0 / penalty - penalty))
        return b.ggml_add(ctx, logits, b.ggml_mul(ctx, change, seen))

    def _sample(self, ctx: int, logits: int, params: SamplingParams, draw: int
                ) -> tuple[int, int]:  # fmt: skip
        """(pick [1] int32, check [1]) of LOGITS [vocab] by pick_one's rule with DRAW [1]."""
        b = self._b
        vocab = int(b.ggml_nelements(logits))
        rows = b.ggml_reshape_2d(ctx, logits, 1, vocab)  # a value a row, for get_rows
        if params.greedy:
            pick = b.ggml_argmax(ctx, b.ggml_reshape_2d(ctx, logits, vocab, 1))
            return pick, b.ggml_reshape_1d(ctx, b.ggml_get_rows(ctx, rows, pick), 1)
        k = params.top_k if 0 < params.top_k < vocab else vocab
        ids = b.ggml_top_k(ctx, logits, k)  # in no order
        values = b.ggml_get_rows(ctx, rows, ids)  # [1, k]
        order = b.ggml_argsort(ctx, b.ggml_reshape_1d(ctx, values, k), _SORT_DESC)
        ids = b.ggml_get_rows(ctx, b.ggml_reshape_2d(ctx, ids, 1, k), order)  # [1, k] int32
        values = b.ggml_reshape_1d(ctx, b.ggml_get_rows(ctx, values, order), k)
        probs = b.ggml_soft_max_ext(ctx, values, None, 1.0 / params.temperature, 0.0)
        if params.top_p < 1.0:  # kept where the mass strictly ahead is below top_p
            ahead = b.ggml_sub(ctx, b.ggml_cumsum(ctx, probs), probs)
            probs = b.ggml_mul(ctx, probs, b.ggml_step(ctx, b.ggml_scale_bias(
                ctx, ahead, -1.0, params.top_p)))  # fmt: skip
        cumulative = b.ggml_cumsum(ctx, probs)
        kept = b.ggml_view_1d(ctx, cumulative, 1, (k - 1) * 4)
        point = b.ggml_mul(ctx, draw, kept)
        # how many cumulative masses are <= the point: k minus those above it, at most k - 1
        above = b.ggml_sum(ctx, b.ggml_step(ctx, b.ggml_sub(ctx, cumulative, point)))
        index = b.ggml_clamp(ctx, b.ggml_scale_bias(ctx, above, -1.0, float(k)), 0.0,
                             float(k - 1))  # fmt: skip
        pick = b.ggml_get_rows(ctx, ids, b.ggml_cast(ctx, index, GGML_I32))
        return b.ggml_reshape_1d(ctx, pick, 1), kept

    # -- work

    def forget(self) -> None:
        """A new prompt: no code seen yet."""
        self.seen[:] = 0.0

    def frame(self, hidden: np.ndarray, sampler: Sampler, allow_stop: bool) -> np.ndarray:
        """One frame from the global HIDDEN state: (positions,) int32 picks, [0] continue (0)
        or stop (1), then the codes; a buffer the next frame overwrites. Draws one uniform a
        position from SAMPLER's generator."""
        key = (sampler.text_params, sampler.audio_params)
        frame = self._frames.pop(key, None)
        if frame is None:
            frame = self._build(*key)
            while len(self._frames) >= FRAME_GRAPHS_KEPT:
                self._free(self._frames.pop(next(iter(self._frames))))
        self._frames[key] = frame  # the most recent last
        frame.hidden[:] = hidden
        frame.draws[:] = sampler.rng.random(self.positions)
        # every input written each frame: ggml's allocator reuses an input's memory after
        # its last reader
        frame.stop[:] = (0.0, 0.0 if allow_stop else -np.inf)
        status = self._b.ggml_backend_graph_compute(self._backend, frame.graph)
        if status != 0:
            raise ToolError(f"ggml could not compute the local transformer (status {status})")
        self.logits, self.last_draws = frame.logits, frame.draws
        picks = frame.picks
        if not np.isfinite(frame.checks).all():
            self._diagnose(frame, sampler, allow_stop)
        if picks[0] == 0:
            self.seen[np.arange(self.positions - 1), picks[1:]] = 1.0
        return picks

    def _diagnose(self, frame: _Frame, sampler: Sampler, allow_stop: bool) -> None:
        """A position left no finite mass: pick_one on its logits says why, in its words."""
        for p, logits in enumerate(frame.logits):
            logits = logits.copy()
            if p == 0:
                logits[1] = logits[1] if allow_stop else -np.inf
                sampler.pick("text", logits, float(frame.draws[0]))
            else:
                sampler.pick("audio", logits, float(frame.draws[p]),
                             self.seen[p - 1, : logits.shape[0]] > 0)  # fmt: skip
        raise NumericError("the local transformer's sampling found no finite probability",
                           hint="the backbone output is broken")  # fmt: skip

    def _free(self, frame: _Frame) -> None:
        self._b.ggml_gallocr_free(frame.alloc)
        self._b.ggml_free(frame.ctx)

    def close(self) -> None:
        for frame in getattr(self, "_frames", {}).values():
            self._free(frame)
        self._frames, self.logits = {}, []
        if getattr(self, "_backend", None):
            self._b.ggml_backend_free(self._backend)
        self._backend = None
        for buffer in getattr(self, "_table_buffers", []):
            self._b.ggml_backend_buffer_free(buffer)
        self._table_buffers = []
        for name in ("_ctx", "_tables_ctx"):
            ctx = getattr(self, name, None)
            if ctx:
                self._b.ggml_free(ctx)
            setattr(self, name, None)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have unloaded ctypes
            pass

