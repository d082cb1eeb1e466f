"""What one run established about files it wrote, remembered by file identity (HashRecord).

`all` writes the tables, hard-links them into the weights folder, lists them in the
manifest and verifies the folder. A digest taken while a file was written (or by a first
hash) is reused for the same inode instead of reading gigabytes again; so are the facts a
table's writer checked on every value it wrote (its header, and that all values are
finite in its dtype), which spare verify a second read of the table. The run creates one
record and hands it to extract, the quantize engine, layout and verify (their `record`
arguments): what one step learned reaches the next through the call, nothing else.

The key is (device, inode, size, mtime): any later change to the file forgets it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

Identity = tuple[int, int, int, int]


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


def file_identity(path: Path) -> Identity:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class HashRecord:
    """One run's record of files already hashed, and of those whose writer checked every
    value: handed from step to step, so a later step need not read them again."""

    digests: dict[Identity, str] = field(default_factory=dict)
    tables: dict[Identity, TableFacts] = field(default_factory=dict)
    checked_ggufs: set[Identity] = field(default_factory=set)

    def remember_sha256(self, path: Path, digest: str) -> None:
        """Record the digest of a file that is complete and will not change."""
        self.digests[file_identity(path)] = digest

    def known_sha256(self, path: Path) -> str | None:
        """The digest this run already took of this very file, if any."""
        try:
            return self.digests.get(file_identity(path))
        except OSError:
            return None

    def sha256(self, path: Path) -> str:
        """The file's sha256, read once per inode (hard links share it) and size and mtime."""
        key = file_identity(path)
        digest = self.digests.get(key)
        if digest is None:
            digest = self.digests[key] = sha256_file(path)
        return digest

    def remember_table(self, path: Path, digest: str, facts: TableFacts) -> None:
        """Record a finished table: its digest and what its writer checked."""
        key = file_identity(path)
        self.digests[key] = digest
        self.tables[key] = facts

    def known_table(self, path: Path) -> tuple[TableFacts, str] | None:
        """The facts and digest this run recorded for this very table file, if any."""
        try:
            key = file_identity(path)
        except OSError:
            return None
        facts, digest = self.tables.get(key), self.digests.get(key)
        return (facts, digest) if facts is not None and digest is not None else None

    def remember_checked_gguf(self, path: Path, digest: str) -> None:
        """Record a finished GGUF whose writer checked every value it wrote finite (ggml's row
        validator on the quantized blocks, the source's own check on the rest)."""
        key = file_identity(path)
        self.digests[key] = digest
        self.checked_ggufs.add(key)

    def known_checked_gguf(self, path: Path) -> str | None:
        """The digest of this very GGUF if this run wrote and checked it, else None."""
        try:
            key = file_identity(path)
        except OSError:
            return None
        return self.digests.get(key) if key in self.checked_ggufs else None
