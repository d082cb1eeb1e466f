"""gguf-py's reader, as the tests use it to read what we wrote: over a plain array, and kept.

np.memmap's bookkeeping on every slice makes gguf.GGUFReader spend 6-12 s on a 150k-token
vocabulary (300k small slices) here; over a plain view of the same map it takes 3 s, and the
parsing is still gguf's own. A file read again unchanged (same inode, size and mtime) is not
parsed again.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import gguf
import numpy as np


class PlainGGUFReader(gguf.GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map."""

    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = value.view(np.ndarray)


@functools.lru_cache(maxsize=2)  # a reader of the tiny model's vocabulary holds ~225 MB
def _reader(path: str, identity: tuple[int, int, int]) -> PlainGGUFReader:
    return PlainGGUFReader(path)


def gguf_reader(path: Path | str) -> PlainGGUFReader:
    """The reader of PATH (shared: do not change what it returns)."""
    st = os.stat(path)
    return _reader(str(path), (st.st_ino, st.st_size, st.st_mtime_ns))
