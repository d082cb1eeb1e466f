"""`moss-gguf all` vs the guide's three steps vs the floor, alternated, medians and ratios.

    LLAMA_CPP_DIR=... python benchmarks/all.py [--rounds 3] [--quant Q4_K_M ...]
        [--engine direct] [--layers 36] [--no-guide]

- all:   moss-gguf all --model CKPT --output OUT --quant Q4_K_M [--quant ...]
- guide: step 1 extract (moss-gguf extract: the guide's layout), step 2 llama.cpp's
         convert_hf_to_gguf.py --outtype f16, step 3 llama-quantize f16 → each type
- floor: llama-quantize alone on the f16 GGUF, once per type ("quantize"), + `cp -r` of
         the checkpoint ("cp"); the floor is their sum

Every command starts with the checkpoint in the page cache, as after a download: it is read
just before each timed run. (`all` drops the source pages it has read once, so without this
the command after it would start cold.) Each run is followed by `sync` inside its timing.
Peak RSS is the largest of the run's processes; peak extra disk is sampled from the
filesystem every 0.1 s during the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import DEFAULT_DIR, du, real_dims_checkpoint, remove


class DiskPeak:
    """Highest filesystem usage above the starting point while running."""

    def __init__(self, path: Path):
        self.path = path
        self.base = shutil.disk_usage(path).used
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, shutil.disk_usage(self.path).used - self.base)
            time.sleep(0.1)

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run(cmd: list[str], env: dict | None = None) -> float:
    """Run to completion; returns the child's peak RSS in MB."""
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return usage.ru_maxrss / 1024


def cache(folder: Path) -> None:
    """Read every file of folder, so that it is in the page cache."""
    buf = bytearray(8 << 20)
    for path in sorted(folder.iterdir()):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def timed(name: str, steps: list[list[str] | Path], root: Path, model: Path) -> dict:
    """Run the steps in turn (a command, or a Path to delete); one timing for all of them."""
    cache(model)
    os.sync()
    start = time.perf_counter()
    rss = 0.0
    with DiskPeak(root) as disk:
        for step in steps:
            if isinstance(step, Path):
                remove(step)
            else:
                rss = max(rss, run(step))
        os.sync()
    result = {"name": name, "wall": time.perf_counter() - start, "rss_mb": rss,
              "disk_peak_gb": disk.peak / 1e9}
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quant", action="append", help="repeatable; default Q4_K_M")
    parser.add_argument("--engine", default="auto", help="all's --engine")
    parser.add_argument("--layers", type=int, default=2, help="2 (default) or 36: the real model")
    parser.add_argument("--no-guide", action="store_true",
                        help="skip timing the guide's chain (its f16 GGUF is made untimed)")
    args = parser.parse_args()
    quants = args.quant or ["Q4_K_M"]
    tree = Path(os.environ.get("LLAMA_CPP_DIR") or sys.exit("set LLAMA_CPP_DIR: docs/install.md"))
    quantize_bin = str(tree / "build/bin/llama-quantize")
    converter = str(tree / "convert_hf_to_gguf.py")
    moss = shutil.which("moss-gguf") or sys.exit("moss-gguf is not installed")
    model = real_dims_checkpoint(layers=args.layers)
    root = DEFAULT_DIR
    out_all, ex, f16, q = root / "b-all", root / "b-ex", root / "b-f16.gguf", root / "b-q.gguf"
    cp_out = root / "b-cp"
    env_py = {**os.environ, "PYTHONPATH": str(tree / "gguf-py")}

    all_cmd = [[moss, "all", "--model", str(model), "--output", str(out_all), "-q",
                "--audio-tokenizer", "none",
                "--engine", args.engine, *[a for t in quants for a in ("--quant", t)]]]
    quantize_cmds: list[list[str] | Path] = []
    for t in quants:
        quantize_cmds += [q, [quantize_bin, str(f16), str(q), t]]
    make_f16: list[list[str] | Path] = [
        [moss, "extract", "--model", str(model), "--output", str(ex), "-q"],
        [sys.executable, converter, str(ex / "qwen3_backbone"), "--outfile", str(f16),
         "--outtype", "f16"],
        ex / "qwen3_backbone",
    ]
    guide_cmds = make_f16 + quantize_cmds
    runs = []
    for _ in range(args.rounds):
        for p in (out_all, ex, f16, q, cp_out):
            remove(p)
        runs.append(timed("all", all_cmd, root, model))
        runs[-1]["outputs_gb"] = du(out_all) / 1e9
        remove(out_all)
        os.environ["PYTHONPATH"] = env_py["PYTHONPATH"]  # the tree's own gguf-py
        if args.no_guide:
            timed("make f16 (untimed)", make_f16, root, model)
        else:
            runs.append(timed("guide", guide_cmds, root, model))
        os.environ.pop("PYTHONPATH")
        remove(q)
        remove(ex)
        runs.append(timed("quantize", quantize_cmds, root, model))
        remove(q)
        runs.append(timed("cp", [["cp", "-r", str(model), str(cp_out)]], root, model))
        for p in (q, cp_out):
            remove(p)
    for p in (out_all, ex, f16, q, cp_out):
        remove(p)
    table = {"quants": quants, "engine": args.engine, "layers": args.layers}
    for name in ("all", "quantize", "cp") if args.no_guide else ("all", "guide", "quantize", "cp"):
        mine = [r for r in runs if r["name"] == name]
        table[name] = {"wall_median_s": round(statistics.median(r["wall"] for r in mine), 2),
                       "walls": [round(r["wall"], 2) for r in mine],
                       "peak_rss_mb": round(max(r["rss_mb"] for r in mine)),
                       "peak_extra_disk_gb": round(max(r["disk_peak_gb"] for r in mine), 2)}
        if name == "all":
            table[name]["outputs_gb"] = round(mine[0]["outputs_gb"], 2)
    floor = table["quantize"]["wall_median_s"] + table["cp"]["wall_median_s"]
    table["floor_s"] = round(floor, 2)
    table["all_over_floor"] = round(table["all"]["wall_median_s"] / floor, 3)
    table["all_over_quantize_alone"] = round(table["all"]["wall_median_s"]
                                             / table["quantize"]["wall_median_s"], 3)
    if not args.no_guide:
        table["all_over_guide"] = round(table["all"]["wall_median_s"]
                                        / table["guide"]["wall_median_s"], 3)
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
