"""The memory floor of a generation step: the bytes one step must read, over read bandwidth.

A CPU decode step is bounded by the weights it reads (docs/memory-floor.md). One step in
audio must read every backbone tensor but the token embedding (the engine feeds summed
embeddings, llama.cpp never reads it) and the text head's rows it does not use (two are
used while the model speaks: `StepPlan.text_ids`), plus the audio heads. The heads are
counted at float16 whatever precision runs them, and the bandwidth is a NumPy sum over 2 GB
(best of 5) measured in the same run, so the figure cannot be moved by the choices it
judges. The floor leaves out what is small beside that (33 embedding rows, the KV cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..gguf.read import inspect_gguf
from .config import SynthConfig, find_model_info
from .heads import head_shape
from .text_head import HEAD_TENSORS

TOKEN_EMBEDDING = "token_embd.weight"
TEXT_ROWS_IN_AUDIO = 2  # the gen slot and the delay slot
BANDWIDTH_BYTES = 2 << 30
BANDWIDTH_REPEATS = 5


@dataclass(frozen=True)
class StepFloor:
    backbone_bytes: int  # every backbone tensor but the token embedding and the text head
    text_rows_bytes: int  # the rows of the text head a step in audio reads
    audio_heads_bytes: int  # n_vq × audio rows × hidden at float16
    bandwidth: float  # bytes a second a NumPy read reaches here, now

    @property
    def step_bytes(self) -> int:
        return self.backbone_bytes + self.text_rows_bytes + self.audio_heads_bytes

    @property
    def ms(self) -> float:
        """The fastest a step can be: its bytes read once at the measured bandwidth."""
        return 1000.0 * self.step_bytes / self.bandwidth


def step_bytes(config: SynthConfig) -> tuple[int, int, int]:
    """(backbone, text head rows, audio heads at f16) bytes one step in audio must read."""
    info = inspect_gguf(Path(config.backbone_gguf))
    head = next(info.tensors[n] for n in HEAD_TENSORS if n in info.tensors)
    backbone = sum(t.n_bytes for name, t in info.tensors.items()
                   if name not in (TOKEN_EMBEDDING, head.name))  # fmt: skip
    text_rows = TEXT_ROWS_IN_AUDIO * head.n_bytes // head.shape[1]
    model = find_model_info(config)
    rows, hidden = head_shape(Path(config.lm_head_dir))
    return backbone, text_rows, model.n_vq * rows * hidden * 2


def read_bandwidth(nbytes: int = BANDWIDTH_BYTES, repeats: int = BANDWIDTH_REPEATS) -> float:
    """Bytes a second a NumPy sum reads NBYTES at, best of REPEATS (the pages touched first)."""
    data = np.ones(nbytes // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - t0)
    return data.nbytes / best


def step_floor(config: SynthConfig, bandwidth: float | None = None) -> StepFloor:
    """The floor of a step for CONFIG's model, at BANDWIDTH (measured now when None)."""
    backbone, text_rows, heads = step_bytes(config)
    return StepFloor(backbone, text_rows, heads, bandwidth or read_bandwidth())
