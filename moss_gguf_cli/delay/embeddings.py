"""Input embeddings: the sum of the text table and the n_vq audio tables (docs/ARCHITECTURE.md §5).

The tables stay memory-mapped in their stored dtype (the real text table is 1.27 GB
as float16 and would be 2.5 GB as float32); only the gathered rows become float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError

TEXT_NAME = "embed_tokens.npy"
AUDIO_NAME = "emb_ext_{:02d}.npy"
STORED_DTYPES = (np.float16, np.float32)


def open_table(path: Path) -> np.ndarray:
    """A 2-D float16/float32 .npy, memory-mapped read-only (never unpickled)."""
    if not path.is_file():
        raise InputError("table not found", path=path, hint="rerun extract / layout")
    try:
        table = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"not a readable .npy table: {exc}", path=path) from exc
    if table.ndim != 2 or table.dtype.type not in STORED_DTYPES:
        raise InputError(
            f"expected a 2-D float16/float32 table, found {table.dtype} {table.shape}", path=path
        )
    return table


class EmbeddingTables:
    """Sums one text row and n_vq audio rows per prompt/generation row."""

    def __init__(self, embedding_dir: Path, n_vq: int, audio_rows: int):
        embedding_dir = Path(embedding_dir)
        self.text = open_table(embedding_dir / TEXT_NAME)
        self.hidden = int(self.text.shape[1])
        self.audio = [open_table(embedding_dir / AUDIO_NAME.format(k)) for k in range(n_vq)]
        extra = embedding_dir / AUDIO_NAME.format(n_vq)
        if extra.is_file():
            raise InputError(
                f"more audio tables than the model's n_vq {n_vq}",
                path=extra,
                hint="the embeddings and the model config belong to different models",
            )
        for k, table in enumerate(self.audio):
            if table.shape != (audio_rows, self.hidden):
                raise InputError(
                    f"audio table {k} has shape {table.shape}, expected ({audio_rows}, "
                    f"{self.hidden})",
                    path=embedding_dir / AUDIO_NAME.format(k),
                )
        self.n_vq = n_vq
        self.text_vocab = int(self.text.shape[0])
        self.audio_rows = audio_rows

    def check_ids(self, rows: np.ndarray) -> None:
        text, audio = rows[:, 0], rows[:, 1:]
        if text.min() < 0 or text.max() >= self.text_vocab:
            raise InputError(f"a text id falls outside the {self.text_vocab}-row table")
        if audio.min() < 0 or audio.max() >= self.audio_rows:
            raise InputError(f"an audio code falls outside the {self.audio_rows}-row tables")

    def sum_rows(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(S, 1 + n_vq) ids → (S, hidden) float32 summed embeddings."""
        rows = np.asarray(rows, dtype=np.int64)
        if out is None:
            out = np.empty((rows.shape[0], self.hidden), dtype=np.float32)
        out[...] = self.text[rows[:, 0]]
        for k, table in enumerate(self.audio):
            out += table[rows[:, 1 + k]]
        return out

    def sum_row(self, row: np.ndarray, out: np.ndarray) -> np.ndarray:
        """One row into OUT (hidden,) float32 without allocating a (1, hidden) batch."""
        np.copyto(out, self.text[int(row[0])], casting="unsafe")
        for k, table in enumerate(self.audio):
            np.add(out, table[int(row[1 + k])], out=out, casting="unsafe")
        return out
