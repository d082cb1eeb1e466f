"""Dropping the checkpoint's pages from the page cache once every reader has read them.

`all` reads each source tensor once per reader and never again: extract reads the tables'
tensors, convert the backbone's, and both read the text embedding and head. Left cached,
those pages compete with the intermediate GGUF that quantize reads next (the real 16 GB
checkpoint and its 16 GB GGUF do not both fit in a 32 GB machine), and the GGUF's pages
must come from memory not touched in a while, which on a VM costs the host a fault per
page. Dropping a range as soon as its last expected reader is past it hands its pages,
just touched, to the GGUF being written.

Only ranges every reader announced are dropped, and only behind all of them; a reader
that reports a range nobody announced changes nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

DROP_STEP = 32 << 20  # drop in steps of this many bytes (and at a range's end)

Range = tuple[str, int, int]  # (file, absolute offset, length)


def _key(path: Path, offset: int, nbytes: int) -> Range:
    # the real path: a Hub snapshot's files are links into its blob store
    return (os.path.realpath(path), int(offset), int(nbytes))


class SourcePages:
    """Who still has to read which source range; drops each part all readers are past."""

    def __init__(self, drop: Callable[[str, int, int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._progress: dict[Range, dict[str, int]] = {}  # range -> reader -> bytes read
        self._dropped: dict[Range, int] = {}  # range -> bytes already dropped
        self._drop = drop or _fadvise_dontneed

    def expect(self, reader: str, ranges: Iterable[tuple[Path, int, int]]) -> None:
        """`reader` will read each (path, offset, nbytes) range once, from its start."""
        with self._lock:
            for path, offset, nbytes in ranges:
                self._progress.setdefault(_key(path, offset, nbytes), {})[reader] = 0

    def reader(self, name: str, path: Path, offset: int, nbytes: int) -> Callable[[int], None]:
        """The callback with which reader `name` reports how many bytes of the range
        (path, offset, nbytes) it has read, from its start."""
        key = _key(path, offset, nbytes)
        return lambda upto: self._read(name, key, upto)

    def _read(self, reader: str, key: Range, upto: int) -> None:
        with self._lock:
            progress = self._progress.get(key)
            if progress is None or reader not in progress:
                return
            progress[reader] = max(progress[reader], upto)
            low = min(progress.values())
            start = self._dropped.get(key, 0)
            if low <= start or (low - start < DROP_STEP and low < key[2]):
                return
            self._dropped[key] = low
        self._drop(key[0], key[1] + start, low - start)


def _fadvise_dontneed(path: str, offset: int, length: int) -> None:
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # only a hint
    finally:
        os.close(fd)
