"""MOSS-TTS-Realtime's depth transformer, heads and sampling as one ggml graph a frame.

A frame's sixteen codes are sixteen dependent positions: position 0 reads the backbone's last
hidden state, position i + 1 reads depth table i's row of the code position i picked; every
position runs the four Qwen3 layers (RMSNorm, q/k RMSNorm per head, NEOX RoPE at the
position's index, grouped attention over the frame's positions so far, SwiGLU), the final
RMSNorm and its own head, and samples its code in the graph (tts/graph_sampling: pick_one's
rule, one uniform draw a position). One call a frame returns the sixteen codes.

The weights are the depth GGUF's bytes as stored (realtime/depth_gguf.py), copied once into a
ggml context: ggml's kernels read the quantized types directly, and `get_rows` widens a
depth table's row. The keys and values of a frame's positions live in caches the graph
writes in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..errors import InputError, NumericError
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
    linear,
    overhead,
    rms_norm,
    rope,
    tensor_bytes,
)
from ..native import libggml
from ..tts.graph_sampling import penalised, sample
from ..tts.sampling import Sampler, SamplingParams
from .config import QwenDims
from .depth_gguf import ARCH, dims_of

_NODES_A_LAYER = 64
_NODES_A_POSITION = 64
FRAME_GRAPHS_KEPT = 4  # one a sampling setting in use
_BLOCK = ("attn_norm", "attn_q", "attn_q_norm", "attn_k", "attn_k_norm", "attn_v",
          "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")  # fmt: skip


@dataclass
class _Frame:
    graph: Graph
    hidden: np.ndarray  # position 0's input
    draws: np.ndarray  # a uniform a position
    stop: np.ndarray  # added to position 0's logits: 0, or -inf at the audio EOS
    seen: np.ndarray  # (rvq, audio_vocab): 1.0 where the penalty counts a code as seen
    picks: np.ndarray  # (rvq,) int32
    checks: np.ndarray  # a position's kept mass (greedy: its pick's logit): finite when sound
    logits: list[np.ndarray]


def read_tensors(reader: gguf.GGUFReader, path: Path) -> dict[str, gguf.ReaderTensor]:
    arch = reader.fields.get("general.architecture")
    name = bytes(arch.parts[arch.data[0]]).decode() if arch is not None else None
    if name != ARCH:
        raise InputError(f"general.architecture is {name!r}, not {ARCH!r}", path=path,
                         hint="depth_gguf in the synth config names the wrong file")  # fmt: skip
    return {t.name: t for t in reader.tensors}


class DepthTransformer(Owner):
    """The depth GGUF at PATH run a frame at a time: `frame(hidden, sampler, allow_stop)`."""

    def __init__(self, path: Path, rvq: int, audio_eos: int, threads: int = 1):
        libggml.load()
        self.path = Path(path)
        reader = gguf.GGUFReader(self.path)
        tensors = read_tensors(reader, self.path)
        self.dims: QwenDims = dims_of(reader)
        self.rvq, self.audio_eos = rvq, audio_eos
        self._store: Weights | None = None
        self._backend: CpuBackend | None = None
        self._frames: dict[SamplingParams, _Frame] = {}
        self.logits: list[np.ndarray] = []
        used = [t for t in tensors.values() if not t.name.startswith("audio_embd.")]
        d = self.dims
        size = sum(int(t.n_bytes) + 64 for t in used)
        size += d.layers * 2 * tensor_bytes(GgmlType.F32, (d.head_dim, rvq, d.kv_heads))
        size += overhead(len(used) + 2 * d.layers + 8) + (1 << 20)
        try:
            self._store = Weights(size)
            self._w = {t.name: self._copy(t) for t in used}
            self._caches = [(self._store.zeros(f"blk.{i}.cache_k", GgmlType.F32,
                                               (d.head_dim, rvq, d.kv_heads)),
                             self._store.zeros(f"blk.{i}.cache_v", GgmlType.F32,
                                               (rvq, d.head_dim, d.kv_heads)))
                            for i in range(d.layers)]  # fmt: skip
            self.vocab = int(self._w["depth_head.0.weight"].ne[1])
            self._backend = CpuBackend(threads)
        except KeyError as exc:
            self.close()
            raise InputError(f"tensor {exc.args[0]!r} is missing", path=self.path,
                             hint="convert the model again") from None  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _copy(self, t: gguf.ReaderTensor) -> Tensor:
        ne = tuple(int(n) for n in t.shape)  # ggml order
        out = self._store.new(t.name, GgmlType(int(t.tensor_type)), ne)
        stored = np.asarray(t.data).reshape(-1).view(np.uint8)
        np.frombuffer(self._store.raw(out), np.uint8)[:] = stored
        return out

    # -- the frame graph

    def _build(self, params: SamplingParams) -> _Frame:
        d, rvq, f32, i32 = self.dims, self.rvq, GgmlType.F32, GgmlType.I32
        g = Graph(rvq * (_NODES_A_LAYER * d.layers + _NODES_A_POSITION), backend=self._backend,
                  label="the depth transformer")  # fmt: skip
        try:
            x = g.input("hidden", f32, (d.hidden,))
            stop = g.input("stop", f32, (self.vocab,))
            seen = g.input("seen", f32, (self.vocab, rvq))
            draws = g.input("draws", f32, (rvq,))
            picks = g.buffer("picks", i32, (rvq,))
            checks = g.buffer("checks", f32, (rvq,))
            pos_q = g.buffer("positions_q", i32, (rvq,))
            pos_k = g.buffer("positions_k", i32, (rvq,))
            for p in range(rvq):
                at = f"p{p}"
                qp = g.view(pos_q, (1,), offset=p, name=f"{at}.pos_q")
                kp = g.view(pos_k, (1,), offset=p, name=f"{at}.pos_k")
                for i in range(d.layers):
                    x = self._block(g, i, x, qp, kp, p, f"{at}.blk{i}")
                normed = rms_norm(g, x, weight=self._w["output_norm.weight"],
                                  eps=d.rms_eps, name=f"{at}.norm")  # fmt: skip
                logits = g.output(g.mul_mat(self._w[f"depth_head.{p}.weight"], normed,
                                            name=f"{at}.logits"))  # fmt: skip
                if p == 0:
                    logits = g.add(logits, stop, name=f"{at}.stop_masked")
                row = g.view(seen, (self.vocab,), offset=p * self.vocab, name=f"{at}.seen")
                logits = penalised(g, logits, row, params, at)
                draw = g.view(draws, (1,), offset=p, name=f"{at}.draw")
                pick, check = sample(g, logits, params, draw, at)
                g.expand(g.cpy(pick, g.view(picks, (1,), offset=p, name=f"{at}.pick_slot"),
                               name=f"{at}.pick_out"))  # fmt: skip
                g.expand(g.cpy(check, g.view(checks, (1,), offset=p, name=f"{at}.check_slot"),
                               name=f"{at}.check_out"))  # fmt: skip
                if p + 1 < rvq:
                    row = g.get_rows(self._w[f"depth_embd.{p}.weight"], pick,
                                     name=f"{at}.next_row")  # fmt: skip
                    x = g.reshape(row, (d.hidden,), name=f"{at}.next")
            g.allocate()
            a = g.inputs
            a["positions_q"][:] = np.arange(rvq)
            a["positions_k"][:] = np.arange(rvq)
            return _Frame(g, a["hidden"], a["draws"], a["stop"], a["seen"], a["picks"],
                          a["checks"], [g.outputs[f"p{p}.logits"] for p in range(rvq)])
        except BaseException:
            g.close()
            raise

    def _block(self, g: Graph, i: int, x: Tensor, qp: Tensor, kp: Tensor, p: int,
               at: str) -> Tensor:  # fmt: skip
        """Layer I at position P over X [hidden]: its key and value written to the caches at
        P, attention over positions 0..P."""
        d, w = self.dims, lambda n: self._w[f"blk.{i}.{n}.weight"]
        hd, eps = d.head_dim, d.rms_eps
        normed = rms_norm(g, x, weight=w("attn_norm"), eps=eps, name=f"{at}.attn_norm")
        # [hd, 1 row, heads]: rope takes one position for the row, attention a head a matrix
        q = g.reshape(linear(g, normed, w("attn_q"), name=f"{at}.q"), (hd, d.heads, 1),
                      name=f"{at}.q_heads")  # fmt: skip
        k = g.reshape(linear(g, normed, w("attn_k"), name=f"{at}.k"), (hd, d.kv_heads, 1),
                      name=f"{at}.k_heads")  # fmt: skip
        v = g.reshape(linear(g, normed, w("attn_v"), name=f"{at}.v"), (1, hd, d.kv_heads),
                      name=f"{at}.v_heads")  # fmt: skip
        q = rms_norm(g, q, weight=w("attn_q_norm"), eps=eps, name=f"{at}.q_norm")
        k = rms_norm(g, k, weight=w("attn_k_norm"), eps=eps, name=f"{at}.k_norm")
        rotary = Rope(n_dims=hd, mode=RopeMode.NEOX, freq_base=d.rope_theta)
        q = rope(g, q, qp, rotary, name=f"{at}.q_rope")
        k = rope(g, k, kp, rotary, name=f"{at}.k_rope")
        q = g.permute(q, (0, 2, 1, 3), name=f"{at}.q_by_head")  # [hd, 1, heads]
        k = g.permute(k, (0, 2, 1, 3), name=f"{at}.k_by_head")  # [hd, 1, kv heads]
        cache_k, cache_v = self._caches[i]
        g.expand(g.cpy(k, g.view(cache_k, (hd, 1, d.kv_heads), offset=p * hd,
                                 name=f"{at}.k_slot"), name=f"{at}.k_write"))  # fmt: skip
        g.expand(g.cpy(v, g.view(cache_v, (1, hd, d.kv_heads), offset=p,
                                 name=f"{at}.v_slot"), name=f"{at}.v_write"))  # fmt: skip
        keys = g.view(cache_k, (hd, p + 1, d.kv_heads), name=f"{at}.keys")
        values = g.view(cache_v, (p + 1, hd, d.kv_heads), name=f"{at}.values")
        mixed = attention(g, q, keys, values, scale=1.0 / float(np.sqrt(hd)), name=f"{at}.attn")
        flat = g.reshape(mixed, (hd * d.heads,), name=f"{at}.attn_flat")
        x = g.add(x, linear(g, flat, w("attn_output"), name=f"{at}.o"), name=f"{at}.attn_out")
        normed = rms_norm(g, x, weight=w("ffn_norm"), eps=eps, name=f"{at}.ffn_norm")
        mid = g.swiglu(linear(g, normed, w("ffn_gate"), name=f"{at}.gate"),
                       linear(g, normed, w("ffn_up"), name=f"{at}.up"), name=f"{at}.swiglu")
        return g.add(x, linear(g, mid, w("ffn_down"), name=f"{at}.down"), name=f"{at}.out")

    # -- work

    def frame(self, hidden: np.ndarray, sampler: Sampler, seen: np.ndarray,
              allow_stop: bool) -> np.ndarray:  # fmt: skip
        """One frame's codes (rvq,) int32 from the backbone's HIDDEN state; SEEN (rvq, vocab)
        marks the codes the repetition penalty counts; a buffer the next frame overwrites."""
        params = sampler.audio_params
        frame = self._frames.pop(params, None)
        if frame is None:
            frame = self._build(params)
            while len(self._frames) >= FRAME_GRAPHS_KEPT:
                self._frames.pop(next(iter(self._frames))).graph.close()
        self._frames[params] = frame
        # every input written each frame: ggml reuses an input's memory after its last reader
        frame.hidden[:] = hidden
        frame.draws[:] = sampler.rng.random(self.rvq)
        frame.stop[:] = 0.0
        if not allow_stop:
            frame.stop[self.audio_eos] = -np.inf
        frame.seen[:] = seen
        frame.graph.compute()
        self.logits = frame.logits
        if not np.isfinite(frame.checks).all():
            raise NumericError("the depth transformer's sampling found no finite probability",
                               hint="the backbone output is broken")  # fmt: skip
        return frame.picks

    def close(self) -> None:
        for frame in getattr(self, "_frames", {}).values():
            frame.graph.close()
        self._frames, self.logits = {}, []
        self.release("_backend", "_store")
