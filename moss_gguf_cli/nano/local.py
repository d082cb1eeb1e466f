"""MOSS-TTS-Nano's local transformer and heads, in NumPy on the folder's float32 arrays.

One frame (upstream's `_iter_generation_events`): the global hidden state is the local
transformer's position 0, whose output through the text head decides continue (the assistant
slot id) or stop (audio_end); then position 1 takes `wte[slot]` and its output through audio
head 0 gives c0, position k + 1 takes `audio_embeddings[k][c_k]` and gives c(k+1) through
audio head k + 1. The heads are the tables (tied). Each position is one pre-LN block per local
layer over a KV cache of the frame's positions, RoPE on interleaved pairs (upstream's
gpt2_decoder), then ln_f. Every buffer is allocated once: a frame allocates nothing but
NumPy's temporaries of the small attention.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..disk.confine import boundary, child, confined
from ..errors import InputError
from ..tts.sampling import Sampler
from .config import TransformerDims

_GELU_C = float(np.sqrt(2.0 / np.pi))


def load_arrays(folder: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The folder's .npy files by relative name, float32, kept inside the folder."""
    out = {}
    for name in names:
        path = confined(child(folder, name, "a Nano array", folder), boundary(folder))
        if not path.is_file():
            raise InputError(f"{name} is missing", path=folder,
                             hint="rerun `moss-gguf all` on the model")  # fmt: skip
        array = np.load(path, allow_pickle=False)
        if array.dtype != np.float32:
            raise InputError(f"holds {array.dtype}, not float32", path=path,
                             hint="rerun `moss-gguf all` on the model")  # fmt: skip
        out[name] = np.ascontiguousarray(array)
    return out


class _Block:
    """One pre-LN block: attention over the cached positions, then the MLP."""

    def __init__(self, w: dict[str, np.ndarray], prefix: str, dims: TransformerDims,
                 positions: int):  # fmt: skip
        g = lambda name: w[f"{prefix}{name}"]  # noqa: E731 - a short lookup
        self.ln1 = (g("ln_1.weight"), g("ln_1.bias"))
        self.ln2 = (g("ln_2.weight"), g("ln_2.bias"))
        self.qkv_w, self.qkv_b = g("attn.c_attn.weight"), g("attn.c_attn.bias")
        self.proj_w, self.proj_b = g("attn.c_proj.weight"), g("attn.c_proj.bias")
        self.fc_in_w, self.fc_in_b = g("mlp.fc_in.weight"), g("mlp.fc_in.bias")
        self.fc_out_w, self.fc_out_b = g("mlp.fc_out.weight"), g("mlp.fc_out.bias")
        h, heads = dims.hidden, dims.heads
        self.heads, self.head_dim = heads, dims.head_dim
        self.keys = np.zeros((heads, positions, self.head_dim), np.float32)
        self.values = np.zeros((heads, positions, self.head_dim), np.float32)
        self._qkv = np.empty(3 * h, np.float32)
        self._h = np.empty(h, np.float32)
        self._inner = np.empty(dims.inner, np.float32)
        self._out = np.empty(h, np.float32)
        self._scale = np.float32(1.0 / np.sqrt(self.head_dim))

    def forward(self, x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray,
                eps: float) -> None:  # fmt: skip
        """X (hidden,) updated in place by the block at position POS."""
        h = x.shape[0]
        _layer_norm(x, *self.ln1, eps, self._h)
        np.dot(self.qkv_w, self._h, out=self._qkv)
        self._qkv += self.qkv_b
        q = self._qkv[:h].reshape(self.heads, self.head_dim)
        k = self._qkv[h : 2 * h].reshape(self.heads, self.head_dim)
        _rope(q, cos, sin)
        _rope(k, cos, sin)
        self.keys[:, pos] = k
        self.values[:, pos] = self._qkv[2 * h :].reshape(self.heads, self.head_dim)
        keys, values = self.keys[:, : pos + 1], self.values[:, : pos + 1]
        scores = np.einsum("hd,hpd->hp", q, keys) * self._scale
        scores -= scores.max(axis=1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=1, keepdims=True)
        attended = np.einsum("hp,hpd->hd", scores, values).reshape(h)
        np.dot(self.proj_w, attended, out=self._out)
        x += self._out
        x += self.proj_b
        _layer_norm(x, *self.ln2, eps, self._h)
        np.dot(self.fc_in_w, self._h, out=self._inner)
        self._inner += self.fc_in_b
        _gelu_new(self._inner)
        np.dot(self.fc_out_w, self._inner, out=self._out)
        x += self._out
        x += self.fc_out_b


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float,
                out: np.ndarray) -> None:  # fmt: skip
    mean = x.mean()
    np.subtract(x, mean, out=out)
    var = np.dot(out, out) / x.shape[0]
    out *= np.float32(1.0 / np.sqrt(var + eps))
    out *= weight
    out += bias


def _gelu_new(x: np.ndarray) -> None:
    """GPT-2's tanh GELU, in place."""
    inner = x * x
    inner *= np.float32(0.044715)
    inner += 1.0
    inner *= x
    inner *= np.float32(_GELU_C)
    np.tanh(inner, out=inner)
    inner += 1.0
    x *= inner
    x *= np.float32(0.5)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """Interleaved-pair rotation of X (heads, head_dim) in place: (x0, x1) of each pair →
    (x0·cos − x1·sin, x1·cos + x0·sin)."""
    even, odd = x[:, 0::2].copy(), x[:, 1::2].copy()
    x[:, 0::2] = even * cos - odd * sin
    x[:, 1::2] = odd * cos + even * sin


class LocalTransformer:
    """The local transformer of POSITIONS positions (n_vq + 1), its blocks and ln_f."""

    def __init__(self, arrays: dict[str, np.ndarray], dims: TransformerDims, layers: int,
                 positions: int):  # fmt: skip
        self.dims, self.eps = dims, float(dims.eps)
        self.blocks = [_Block(arrays, f"h.{i}.", dims, positions) for i in range(layers)]
        self.ln_f = (arrays["ln_f.weight"], arrays["ln_f.bias"])
        half = dims.head_dim // 2
        exponents = np.arange(half, dtype=np.float64) * 2 / dims.head_dim
        inv = 1.0 / float(dims.rope_base) ** exponents
        angles = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
        self._cos = np.cos(angles).astype(np.float32)
        self._sin = np.sin(angles).astype(np.float32)
        self._x = np.empty(dims.hidden, np.float32)
        self.out = np.empty(dims.hidden, np.float32)
        self.pos = 0

    def reset(self) -> None:
        self.pos = 0  # the caches are overwritten position by position

    def step(self, x: np.ndarray) -> np.ndarray:
        """Feed the next position's input (hidden,); its ln_f output (a reused buffer)."""
        pos = self.pos
        self._x[:] = x
        for block in self.blocks:
            block.forward(self._x, pos, self._cos[pos], self._sin[pos], self.eps)
        _layer_norm(self._x, *self.ln_f, self.eps, self.out)
        self.pos += 1
        return self.out



class NumpyLocal:
    """The reference at run time (`local_type: numpy`): LocalTransformer, each position's
    head as a NumPy product on the float32 tables, sampling by tts/sampling.pick_one; `frame`
    as nano/ggml_local.GgmlLocal's. HEADS: position 0's (continue, stop) rows, then the n_vq
    audio tables (tied: position k + 2 takes table k's row of code k); START: position 1's
    input."""

    def __init__(self, arrays: dict[str, np.ndarray], dims: TransformerDims, layers: int,
                 heads: list[np.ndarray], start: np.ndarray):  # fmt: skip
        self.transformer = LocalTransformer(arrays, dims, layers, len(heads))
        self.heads, self.start = heads, start
        self.positions = len(heads)
        self.logits = [np.empty(h.shape[0], np.float32) for h in heads]  # the last frame's
        self.seen = np.zeros((len(heads) - 1, max(h.shape[0] for h in heads[1:])), bool)
        self._picks = np.zeros(len(heads), np.int64)

    def forget(self) -> None:
        """A new prompt: no code seen yet (the repetition penalty's memory)."""
        self.seen[:] = False

    def frame(self, hidden: np.ndarray, sampler: Sampler, allow_stop: bool) -> np.ndarray:
        """One frame from the global HIDDEN state: (positions,) picks, [0] continue (0) or
        stop (1), then the codes (when it continues); a reused buffer. Draws one uniform a
        position from SAMPLER's generator."""
        draws = sampler.rng.random(self.positions)
        t, picks = self.transformer, self._picks
        t.reset()
        logits = np.dot(self.heads[0], t.step(hidden), out=self.logits[0]).copy()
        if not allow_stop:
            logits[1] = -np.inf
        picks[0] = sampler.pick("text", logits, draws[0])
        if picks[0] == 1:
            return picks
        x = self.start
        for p in range(1, self.positions):
            table = self.heads[p]
            logits = np.dot(table, t.step(x), out=self.logits[p])
            seen = self.seen[p - 1, : table.shape[0]]
            code = picks[p] = sampler.pick("audio", logits.copy(), draws[p], seen)
            seen[code] = True
            x = table[code]
        return picks

    def close(self) -> None:
        pass


# the local transformer's form at run time: ggml graphs at one of these types
# (nano/ggml_local.py), or NumPy on the float32 arrays ("numpy", the reference). Measured on
# 2 idle cores at Nano's dims, a frame's 17 positions with their heads: NumPy float32 25 ms;
# ggml F32 16.6, F16 7.9, Q8_0 6.1 (docs/nano.md, "Speed")
LOCAL_TYPES = ("Q8_0", "F16", "F32", "numpy")
DEFAULT_LOCAL_TYPE = "Q8_0"
