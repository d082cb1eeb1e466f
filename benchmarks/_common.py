"""Helpers shared by the hand-run benchmarks: the real-dims checkpoint and measured runs."""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from moss_gguf_cli.source.tiny import TinySpec, tensor_shapes, write_tiny

# MOSS-TTS's real dims; the benchmarks default to 2 of its 36 layers (every table and head at
# full size, ≈ 3.9 GB bf16); --layers 36 gives the whole model's shape (≈ 17 GB in 4 shards)
REAL_DIMS = TinySpec(hidden=4096, intermediate=12288, layers=2, heads=32, kv_heads=8, head_dim=128,
                     vocab=155648, n_vq=32, audio_vocab=1024, shards=2)
DEFAULT_DIR = Path(os.environ.get("MOSS_GGUF_BENCH_DIR", "/tmp/moss-gguf-bench"))


def real_dims_spec(layers: int = 2) -> TinySpec:
    return replace(REAL_DIMS, layers=layers, shards=2 if layers <= 2 else 4)


def checkpoint_bytes(spec: TinySpec) -> int:
    return sum(2 * math.prod(shape) for shape in tensor_shapes(spec).values())


def real_dims_checkpoint(root: Path = DEFAULT_DIR, layers: int = 2) -> Path:
    """Write the real-dims checkpoint once (tensor by tensor); later runs reuse it."""
    dest = root / f"moss-tts-{layers}layer"
    if (dest / "config.json").is_file():
        return dest
    spec = real_dims_spec(layers)
    need = checkpoint_bytes(spec) * 3.2  # itself, and what all.py writes beside it at its peak
    free = shutil.disk_usage(root.parent if not root.exists() else root).free
    if free < need:
        raise SystemExit(f"need ~{need / 1e9:.0f} GB free under {root} for the {layers}-layer "
                         f"benchmarks, have {free / 1e9:.1f}")
    tmp = root / f".moss-tts-{layers}layer.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_tiny(tmp, spec)
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
