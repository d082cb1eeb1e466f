"""sha256 of output files, remembered by file identity for the rest of the process.

`all` writes the tables, hard-links them into the weights folder and lists them in the
manifest: a digest taken while a file was written (or by a first hash) is reused for the
same inode instead of reading gigabytes again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_DIGESTS: dict[tuple[int, int, int, int], str] = {}


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
