"""`verify --deep` of a Nano folder: llama.cpp runs each global GGUF, and its hidden states are
compared with those of the exact F32 file written from the source (nano/global_gguf.py, in a
temporary folder), on probe rows laid out as upstream's prompt and frames are: text rows
(wte rows alone) and frame rows (the assistant slot's row plus one audio row per codebook).
The limits are the delay family's for hidden states (quality.DEEP_THRESHOLDS)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..report import Rows
from ..verify.deep import llama_hidden
from ..verify.quality import DEEP_THRESHOLDS, deep_class
from .checkpoint import NanoCheckpoint
from .global_gguf import write_global_f32

TEXT_ROWS, FRAME_ROWS = 16, 16


def probe_rows(checkpoint: NanoCheckpoint, seed: int = 0) -> np.ndarray:
    """TEXT_ROWS text rows, then FRAME_ROWS frames: wte[slot] + Σ_q audio_embeddings_q[code]."""
    nano, rng = checkpoint.nano, np.random.default_rng(seed)
    wte = np.asarray(checkpoint.tensors["transformer.wte.weight"], np.float32)
    slot = nano.tokens["audio_assistant_slot_token_id"]
    ids = np.concatenate([rng.integers(0, nano.dims.vocab, TEXT_ROWS), np.full(FRAME_ROWS, slot)])
    rows = wte[ids]
    for q, size in enumerate(nano.codebook_sizes):
        table = np.asarray(checkpoint.tensors[f"audio_embeddings.{q}.weight"], np.float32)
        rows[TEXT_ROWS:] += table[rng.integers(0, size, FRAME_ROWS)]
    return rows


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                        1e-300)  # fmt: skip


def deep_rows(checkpoint: NanoCheckpoint, ggufs: dict[Path, str], rows: Rows) -> None:
    """One row per GGUF (path → its file type): the worst probe row's cosine against the
    exact file's, held to its type's limit."""
    rows.group = "deep"
    embeds = probe_rows(checkpoint)
    with tempfile.TemporaryDirectory(prefix="moss-gguf-nano-deep-") as tmp:
        exact = llama_hidden(write_global_f32(checkpoint, Path(tmp) / "exact.gguf"), embeds)
    for path, file_type in ggufs.items():
        worst = float(_cosines(llama_hidden(path, embeds), exact).min())
        limit = DEEP_THRESHOLDS[deep_class(file_type)][0]
        problems = [] if worst >= limit else [f"hidden-state cosine {worst:.5f} < {limit}"]
        rows.check(f"{path.name}: llama.cpp vs exact", problems,
                   f"{len(embeds)} probe rows, hidden-state cosine ≥ {worst:.5f} "
                   f"(limit {limit})")  # fmt: skip
