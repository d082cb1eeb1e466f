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

from ..errors import NumericError
from ..graphs import (
    Borrowed,
    CpuBackend,
    GgmlType,
    Graph,
    Owner,
    Rope,
    RopeMode,
    Tensor,
    Weights,
    aligned,
    attention,
    block_size,
    layer_norm,
    linear,
    overhead,
    rope,
    tensor_bytes,
)
from ..native import libggml
from ..tts.graph_sampling import penalised, sample
from ..tts.sampling import Sampler, SamplingParams
from .config import TransformerDims

TYPE_IDS = {t.name: t for t in (GgmlType.F32, GgmlType.F16, GgmlType.Q8_0)}  # local_type's
_NODES_A_LAYER = 48  # a block adds ~35 nodes
_NODES_A_POSITION = 48  # input, ln_f, head, sampling (~30)
FRAME_GRAPHS_KEPT = 4  # one a sampling setting in use (a server's requests may differ)
__all__ = ["FRAME_GRAPHS_KEPT", "TYPE_IDS", "GgmlLocal", "aligned"]


@dataclass
class _Frame:
    graph: Graph
    hidden: np.ndarray  # position 0's input
    draws: np.ndarray  # a uniform a position
    stop: np.ndarray  # added to position 0's (continue, stop) logits: 0 or -inf
    picks: np.ndarray  # (positions,) int32: continue/stop, then the codes
    checks: np.ndarray  # a position's kept mass (greedy: its pick's logit): finite when sound
    logits: list[np.ndarray]  # each position's logits before sampling


@dataclass(frozen=True)
class _Io:
    """A frame graph's own tensors besides position 0's input row."""

    stop: Tensor  # [2] input: added to position 0's (continue, stop) logits
    draws: Tensor  # [positions] buffer: a uniform a position
    picks: Tensor  # [positions] int32 buffer: the picks, written by the graph
    checks: Tensor  # [positions] buffer: each position's kept mass
    positions: Tensor  # [heads × positions] int32 buffer, written once: rope's positions


@dataclass(frozen=True)
class _Layer:
    """One block's tensors: (weight, bias) pairs and the frame's key/value caches."""

    ln1: tuple[Tensor, Tensor]
    ln2: tuple[Tensor, Tensor]
    qkv: tuple[Tensor, Tensor]
    proj: tuple[Tensor, Tensor]
    up: tuple[Tensor, Tensor]
    down: tuple[Tensor, Tensor]
    k: Tensor  # [hd, position, head]
    v: Tensor  # transposed, [position, hd, head]: both products of attention read rows


class GgmlLocal(Owner):
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
        libggml.load()  # a missing ggml says so first
        self.dims, self.layers = dims, layers
        self.positions = len(heads)
        self._kind = TYPE_IDS[file_type]
        self._store: Weights | None = None
        self._borrowed: Borrowed | None = None
        self._backend: CpuBackend | None = None
        self._frames: dict[tuple[SamplingParams, SamplingParams], _Frame] = {}
        self.logits: list[np.ndarray] = []  # the last frame's, a position each
        self.last_draws = np.zeros(0, np.float32)  # the last frame's uniform draws
        h, p_max, f32 = dims.hidden, self.positions, GgmlType.F32
        matrices = [arrays[f"h.{i}.{n}.weight"] for i in range(layers)
                    for n in ("attn.c_attn", "attn.c_proj", "mlp.fc_in", "mlp.fc_out")]
        size = sum(self._bytes(m.shape) for m in matrices + heads)
        size += sum(tensor_bytes(f32, a.shape) for a in arrays.values() if a.ndim == 1)
        size += layers * 2 * tensor_bytes(f32, (h, p_max)) + tensor_bytes(f32, (h,))
        size += tensor_bytes(f32, (max(t.shape[0] for t in heads), p_max))  # the seen codes
        size += overhead(16 * layers + 2 * p_max + 16) + (1 << 20)
        try:
            self._store, self._borrowed = Weights(size), Borrowed(p_max)
            self._load(arrays, layers, heads, start)
            self._backend = CpuBackend(threads)
        except BaseException:
            self.close()
            raise

    # -- weights

    def _type(self, cols: int) -> GgmlType:
        # a quantized row is packed in blocks; a narrower row (tiny test models) stays float32
        return self._kind if cols % block_size(self._kind) == 0 else GgmlType.F32

    def _bytes(self, shape: tuple[int, ...]) -> int:
        rows, cols = shape
        return tensor_bytes(self._type(cols), (cols, rows))

    def _matrix(self, name: str, values: np.ndarray) -> Tensor:
        """A (rows, cols) float32 matrix as a ggml tensor [cols, rows] of the chosen type."""
        return self._store.from_numpy(name, values, self._type(values.shape[1]))

    def _pair(self, arrays: dict[str, np.ndarray], name: str, matrix: bool
              ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """NAME's (weight, bias): the weight a matrix of the chosen type or a vector."""
        new = self._matrix if matrix else self._store.from_numpy
        w = new(f"{name}.weight", arrays[f"{name}.weight"])
        return w, self._store.from_numpy(f"{name}.bias", arrays[f"{name}.bias"])

    def _load(self, arrays: dict[str, np.ndarray], layers: int, heads: list[np.ndarray],
              start: np.ndarray) -> None:  # fmt: skip
        dims, store, f32 = self.dims, self._store, GgmlType.F32
        n_head, hd, p_max = dims.heads, dims.head_dim, self.positions
        self._w = []
        for i in range(layers):
            pair = lambda n, m, i=i: self._pair(arrays, f"h.{i}.{n}", m)  # noqa: E731
            self._w.append(_Layer(
                ln1=pair("ln_1", False), ln2=pair("ln_2", False),
                qkv=pair("attn.c_attn", True), proj=pair("attn.c_proj", True),
                up=pair("mlp.fc_in", True), down=pair("mlp.fc_out", True),
                k=store.new(f"h.{i}.cache_k", f32, (hd, p_max, n_head)),
                v=store.new(f"h.{i}.cache_v", f32, (p_max, hd, n_head))))  # fmt: skip
        self._ln_f = self._pair(arrays, "ln_f", False)
        self._heads = [self._matrix(f"head.{p}", m) for p, m in enumerate(heads)]
        self._vocab = [m.shape[0] for m in heads]
        self._start = store.from_numpy("start", start)
        self._tables = [aligned(m) for m in heads[1:]]
        self._table_t = [self._borrowed.place(f"table.{k}", m) for k, m in enumerate(self._tables)]
        # the repetition penalty's memory: 1.0 where audio position k + 1 produced a code
        self._seen_t = store.zeros("seen", f32, (max(self._vocab[1:]), p_max - 1))
        self.seen = store.array(self._seen_t)


    # -- the frame graph

    def _build(self, text: SamplingParams, audio: SamplingParams) -> _Frame:
        h, n_head, p_max = self.dims.hidden, self.dims.heads, self.positions
        f32, i32 = GgmlType.F32, GgmlType.I32
        g = Graph(p_max * (_NODES_A_LAYER * self.layers + _NODES_A_POSITION),
                  backend=self._backend, label="the local transformer")  # fmt: skip
        try:
            x = g.input("hidden", f32, (h,))
            io = _Io(g.input("stop", f32, (2,)),
                     g.buffer("draws", f32, (p_max,)),  # kept: _diagnose reads them
                     g.buffer("picks", i32, (p_max,)), g.buffer("checks", f32, (p_max,)),
                     # rope reads a position a head; written once, so a buffer (ggml reuses
                     # an input's memory after its last reader)
                     g.buffer("positions", i32, (n_head * p_max,)))  # fmt: skip
            for p in range(p_max):
                x = self._position(g, p, x, io, text if p == 0 else audio)
            g.allocate()
            a = g.inputs
            frame = _Frame(g, a["hidden"], a["draws"], a["stop"], a["picks"], a["checks"],
                           [g.outputs[f"p{p}.logits"] for p in range(p_max)])  # fmt: skip
            a["positions"][:] = np.repeat(np.arange(p_max), n_head)
            return frame
        except BaseException:
            g.close()
            raise

    def _position(self, g: Graph, p: int, x: Tensor, io: _Io, params: SamplingParams) -> Tensor:
        """Position P from its input row X: the blocks, its head's logits, its pick (written
        to io.picks[p]); returns the next position's input row."""
        at, n_head = f"p{p}", self.dims.heads
        pos = g.view(io.positions, (n_head,), offset=p * n_head, name=f"{at}.pos")
        for i, lw in enumerate(self._w):
            x = self._block(g, lw, x, pos, p, f"{at}.h{i}")
        normed = layer_norm(g, x, weight=self._ln_f[0], bias=self._ln_f[1],
                            eps=float(self.dims.eps), name=f"{at}.ln_f")  # fmt: skip
        logits = g.output(g.mul_mat(self._heads[p], normed, name=f"{at}.logits"))
        draw = g.view(io.draws, (1,), offset=p, name=f"{at}.draw")
        if p == 0:
            logits = g.add(logits, io.stop, name=f"{at}.stop_masked")
        else:
            seen = g.view(self._seen_t, (self._vocab[p],), offset=(p - 1) * self.seen.shape[1],
                          name=f"{at}.seen")  # fmt: skip
            logits = penalised(g, logits, seen, params, at)
        pick, check = sample(g, logits, params, draw, at)
        g.expand(g.cpy(pick, g.view(io.picks, (1,), offset=p, name=f"{at}.pick_slot"),
                       name=f"{at}.pick_out"))  # fmt: skip
        g.expand(g.cpy(check, g.view(io.checks, (1,), offset=p, name=f"{at}.check_slot"),
                       name=f"{at}.check_out"))  # fmt: skip
        if p == 0:
            return self._start
        row = g.get_rows(self._table_t[p - 1], pick, name=f"{at}.next_row")
        return g.reshape(row, (self.dims.hidden,), name=f"{at}.next")

    def _block(self, g: Graph, lw: _Layer, x: Tensor, pos: Tensor, p: int, at: str) -> Tensor:
        """One block at position P over X [hidden]: its key and value written to the frame's
        caches at P, attention over positions 0..P."""
        dims = self.dims
        h, n_head, hd, eps = dims.hidden, dims.heads, dims.head_dim, float(dims.eps)
        qkv = linear(g, layer_norm(g, x, weight=lw.ln1[0], bias=lw.ln1[1], eps=eps,
                                   name=f"{at}.ln_1"), *lw.qkv, name=f"{at}.qkv")  # fmt: skip
        # q, k, v as [hd, 1, head]: one row a head, ne2 the heads (rope's positions)
        q, k = (g.view(qkv, (hd, 1, n_head), offset=j * h, steps=(hd, hd), name=f"{at}.{part}")
                for j, part in enumerate("qk"))  # fmt: skip
        v = g.view(qkv, (1, hd, n_head), offset=2 * h, steps=(1, hd), name=f"{at}.v")
        rotary = Rope(n_dims=hd, mode=RopeMode.NORMAL, freq_base=float(dims.rope_base))
        q, k = (rope(g, q, pos, rotary, name=f"{at}.q_rope"),
                rope(g, k, pos, rotary, name=f"{at}.k_rope"))  # fmt: skip
        k_at = g.view(lw.k, (hd, 1, n_head), offset=p * hd, name=f"{at}.k_slot")
        v_at = g.view(lw.v, (1, hd, n_head), offset=p, name=f"{at}.v_slot")
        # the cache writes first: nodes run in the order they were added
        g.expand(g.cpy(k, k_at, name=f"{at}.k_write"))
        g.expand(g.cpy(v, v_at, name=f"{at}.v_write"))
        keys = g.view(lw.k, (hd, p + 1, n_head), name=f"{at}.keys")
        values = g.view(lw.v, (p + 1, hd, n_head), name=f"{at}.values")
        mixed = attention(g, q, keys, values, scale=1.0 / float(np.sqrt(hd)), name=f"{at}.attn")
        attended = g.reshape(mixed, (h,), name=f"{at}.attn_flat")
        x = g.add(x, linear(g, attended, *lw.proj, name=f"{at}.proj"), name=f"{at}.attn_residual")
        normed = layer_norm(g, x, weight=lw.ln2[0], bias=lw.ln2[1], eps=eps, name=f"{at}.ln_2")
        up = g.gelu(linear(g, normed, *lw.up, name=f"{at}.fc_in"), name=f"{at}.gelu")
        return g.add(x, linear(g, up, *lw.down, name=f"{at}.fc_out"), name=f"{at}.out")

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
                self._frames.pop(next(iter(self._frames))).graph.close()
        self._frames[key] = frame  # the most recent last
        frame.hidden[:] = hidden
        frame.draws[:] = sampler.rng.random(self.positions)
        # every input written each frame: ggml's allocator reuses an input's memory after
        # its last reader
        frame.stop[:] = (0.0, 0.0 if allow_stop else -np.inf)
        frame.graph.compute()
        self.logits, self.last_draws = frame.logits, frame.draws
        picks = frame.picks
        if not np.isfinite(frame.checks).all():
            self._diagnose(frame, sampler, allow_stop)
        if picks[0] == 0:
            self.seen[np.arange(self.positions - 1), picks[1:]] = 1.0
        return picks

    def graphs(self) -> list[Graph]:
        """The frame graphs kept (one a sampling setting), to dump."""
        return [frame.graph for frame in self._frames.values()]

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

    def close(self) -> None:
        for frame in getattr(self, "_frames", {}).values():
            frame.graph.close()
        self._frames, self.logits = {}, []
        self.release("_backend", "_borrowed", "_store")

