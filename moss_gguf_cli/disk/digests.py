"""What this process established about files it wrote, remembered by file identity.

`all` writes the tables, hard-links them into the weights folder, lists them in the
manifest and verifies the folder. A digest taken while a file was written (or by a first
hash) is reused for the same inode instead of reading gigabytes again; so are the facts a
table's writer checked on every value it wrote (its header, and that all values are
finite in its dtype), which spare verify a second read of the table.

The key is (device, inode, size, mtime): any later change to the file forgets it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

_DIGESTS: dict[tuple[int, int, int, int], str] = {}
_TABLES: dict[tuple[int, int, int, int], TableFacts] = {}
_CHECKED_GGUFS: set[tuple[int, int, int, int]] = set()


@dataclass(frozen=True)
class TableFacts:
    """A .npy table as its writer made it: every value was checked finite in `dtype`."""

    shape: tuple[int, ...]
    dtype: str  # numpy dtype str, e.g. '<f2'
    data_offset: int  # header length


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def remember_sha256(path: Path, digest: str) -> None:
    """Record the digest of a file that is complete and will not change."""
    _DIGESTS[_identity(path)] = digest


def known_sha256(path: Path) -> str | None:
    """The digest this process already took of this very file, if any."""
    try:
        return _DIGESTS.get(_identity(path))
    except OSError:
        return None


def sha256_cached(path: Path) -> str:
    """The file's sha256, read once per inode (hard links share it) and size and mtime."""
    key = _identity(path)
    digest = _DIGESTS.get(key)
    if digest is None:
        digest = _DIGESTS[key] = sha256_file(path)
    return digest


def remember_table(path: Path, digest: str, facts: TableFacts) -> None:
    """Record a finished table: its digest and what its writer checked."""
    key = _identity(path)
    _DIGESTS[key] = digest
    _TABLES[key] = facts


def known_table(path: Path) -> tuple[TableFacts, str] | None:
    """The facts and digest this process recorded for this very table file, if any."""
    try:
        key = _identity(path)
    except OSError:
        return None
    facts, digest = _TABLES.get(key), _DIGESTS.get(key)
    return (facts, digest) if facts is not None and digest is not None else None


def remember_checked_gguf(path: Path, digest: str) -> None:
    """Record a finished GGUF whose writer checked every value it wrote finite (ggml's row
    validator on the quantized blocks, the source's own check on the rest)."""
    key = _identity(path)
    _DIGESTS[key] = digest
    _CHECKED_GGUFS.add(key)


def known_checked_gguf(path: Path) -> str | None:
    """The digest of this very GGUF if this process wrote and checked it, else None."""
    try:
        key = _identity(path)
    except OSError:
        return None
    return _DIGESTS.get(key) if key in _CHECKED_GGUFS else None
