"""Helpers shared by the hand-run benchmarks: the real-dims checkpoint and measured runs."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from moss_gguf_cli.tiny import TinySpec, write_tiny

# MOSS-TTS dims with 2 of its 36 layers: every table and head at full size (≈ 3.9 GB bf16)
REAL_DIMS = TinySpec(hidden=4096, intermediate=12288, layers=2, heads=32, kv_heads=8, head_dim=128,
                     vocab=155648, n_vq=32, audio_vocab=1024, shards=2)
DEFAULT_DIR = Path(os.environ.get("MOSS_GGUF_BENCH_DIR", "/tmp/moss-gguf-bench"))


def real_dims_checkpoint(root: Path = DEFAULT_DIR) -> Path:
    """Write the real-dims checkpoint once; later runs reuse it."""
    dest = root / "moss-tts-2layer"
    if (dest / "config.json").is_file():
        return dest
    free = shutil.disk_usage(root.parent if not root.exists() else root).free
    if free < 20e9:
        raise SystemExit(f"need ~20 GB free under {root} for the benchmarks, have {free / 1e9:.1f}")
    tmp = root / ".moss-tts-2layer.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_tiny(tmp, REAL_DIMS)
    tmp.rename(dest)
    return dest


@dataclass
class Run:
    name: str
    wall: float
    peak_rss_mb: float
    bytes_written: int


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(name: str, cmd: list[str], output: Path, env: dict | None = None) -> Run:
    """Run cmd to completion (and sync its writes): wall time, its own peak RSS, bytes written."""
    os.sync()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    os.sync()
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name} failed: {' '.join(cmd)}")
    return Run(name, wall, usage.ru_maxrss / 1024, du(output))


def report(runs: list[Run]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(r.name for r in runs):
        mine = [r for r in runs if r.name == name]
        table[name] = {
            "wall_median_s": statistics.median(r.wall for r in mine),
            "walls": [round(r.wall, 2) for r in mine],
            "peak_rss_mb": max(r.peak_rss_mb for r in mine),
            "bytes_written": mine[0].bytes_written,
        }
    return table


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
