"""The output sinks write exactly the bytes given, at the right offsets, whatever the sizes."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from moss_gguf_cli.disk.digests import HashRecord, file_identity
from moss_gguf_cli.disk.sinks import (
    DIRECT_BYTES,
    WRITE_BEHIND_BYTES,
    DirectSink,
    FileSink,
    WriteBehindSink,
    appender,
    preallocate,
)
from moss_gguf_cli.pipeline.extract import extract

HEADER = b"H" * 4099  # not a whole block: the direct sink must keep it intact


def _chunks(total: int) -> list[np.ndarray]:
    """Random bytes in odd-sized pieces, some larger than the sinks' buffers and windows."""
    rng = np.random.default_rng(7)
    sizes = [1, 4095, 4097, DIRECT_BYTES + 3, 12345, WRITE_BEHIND_BYTES // 3]
    out, left, i = [], total, 0
    while left > 0:
        n = min(left, sizes[i % len(sizes)])
        out.append(rng.integers(0, 256, n, dtype=np.uint8))
        left -= n
        i += 1
    return out


def _direct_refused(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError as exc:
        return exc.errno == errno.EINVAL
    os.close(fd)
    return False


@pytest.mark.parametrize("kind", ["file", "direct", "behind"])
def test_sink_writes_exactly_the_bytes(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    chunks = _chunks(WRITE_BEHIND_BYTES * 2 + 777)
    size = len(HEADER) + sum(c.nbytes for c in chunks)
    with open(path, "wb+") as out:
        out.write(HEADER)
        out.flush()
        assert preallocate(out, size, path)
        if kind == "direct":
            sink = DirectSink.open(path, out, len(HEADER))
            if sink is None:  # only where the file system refuses O_DIRECT: what appender
                assert _direct_refused(path)  # falls back to, tested the same way
                sink = FileSink(out)
        elif kind == "behind":
            sink = WriteBehindSink.open(out, len(HEADER))
            assert sink is not None  # Linux has sync_file_range
        else:
            sink = FileSink(out)
        for c in chunks:
            sink.write(c)
        assert sink.tell() == size
        sink.close()
        if hasattr(sink, "release"):
            sink.release()
    data = path.read_bytes()
    assert len(data) == size
    assert data[: len(HEADER)] == HEADER
    assert data[len(HEADER) :] == b"".join(c.tobytes() for c in chunks)


def test_refused_o_direct_falls_back_to_plain_writes(tmp_path: Path, monkeypatch) -> None:
    """A file system that refuses O_DIRECT (EINVAL, as tmpfs does) still gets every byte."""
    real_open = os.open

    def refuse(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse)
    path = tmp_path / "out.bin"
    chunks = _chunks(DIRECT_BYTES * 2 + 555)
    size = len(HEADER) + sum(c.nbytes for c in chunks)
    with open(path, "wb+") as out:
        out.write(HEADER)
        out.flush()
        assert DirectSink.open(path, out, len(HEADER)) is None
        with appender(out, path, len(HEADER), size, min_direct=0) as sink:
            assert isinstance(sink, FileSink)
            for c in chunks:
                sink.write(c)
    data = path.read_bytes()
    assert data == HEADER + b"".join(c.tobytes() for c in chunks)


def _resident_fraction(path: Path) -> float:
    """Share of the file's pages in the page cache."""
    pages = resident_pages(path)
    return sum(pages) / len(pages)


def resident_pages(path: Path) -> list[bool]:
    """Which of the file's pages are in the page cache (mincore on a fresh mapping)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    return [bool(v & 1) for v in vec]


def test_write_behind_keeps_the_file_in_the_page_cache(tmp_path: Path) -> None:
    """What the intermediate GGUF needs: quantize reads it next, from memory; the direct
    sink, made for outputs nobody reads at once, leaves it on disk only."""
    sizes = WRITE_BEHIND_BYTES * 3
    block = np.full(1 << 20, 9, dtype=np.uint8)
    fractions = {}
    for kind in ("behind", "direct"):
        path = tmp_path / f"{kind}.bin"
        with open(path, "wb+") as out:
            assert preallocate(out, sizes, path)
            sink = (
                WriteBehindSink.open(out, 0) if kind == "behind" else DirectSink.open(path, out, 0)
            )
            if sink is None:
                assert kind == "direct" and _direct_refused(path)
                continue
            for _ in range(sizes // block.nbytes):
                sink.write(block)
            sink.close()
            sink.release()
        fractions[kind] = _resident_fraction(path)
    assert fractions["behind"] > 0.9, fractions
    if "direct" in fractions:
        assert fractions["direct"] < 0.1, fractions


def test_extract_for_a_reader_hashes_tables_while_writing(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "ex"
    record = HashRecord()
    result = extract(tiny_model, out, backbone_weights=False, record=record)
    assert len(result.npy_files) == 66
    for path in result.npy_files:
        expected = hashlib.sha256(path.read_bytes()).hexdigest()
        assert record.digests.get(file_identity(path)) == expected, path
        assert record.sha256(path) == expected
    assert HashRecord().known_sha256(result.npy_files[0]) is None  # per run, not per process


def test_a_remembered_digest_is_forgotten_once_the_file_changes(tmp_path: Path) -> None:
    record = HashRecord()
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    record.remember_sha256(path, hashlib.sha256(b"abc").hexdigest())
    assert record.known_sha256(path) == hashlib.sha256(b"abc").hexdigest()
    path.write_bytes(b"abcd")  # another size (and mtime): the memo no longer applies
    assert record.known_sha256(path) is None
    assert record.sha256(path) == hashlib.sha256(b"abcd").hexdigest()
