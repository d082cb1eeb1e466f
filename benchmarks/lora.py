"""`all --merge-lora` vs `all`, alternated: wall time, peak RSS, bytes read from disk.

    python benchmarks/lora.py [--rounds 3] [--layers 2] [--quant Q4_K_M] [--rank 16]

The checkpoint is the real-dims one of _common.py (2 of MOSS-TTS's 36 layers by default,
every table and head at full size). The adapter has the community Norwegian adapter's shape
(r 16, alpha 32, all seven projections of every layer targeted, only the MLPs' B non-zero,
float32), written as PEFT's save_pretrained names it. Timed runs start with the checkpoint in
the page cache, as after a download (benchmarks/all.py does the same); then one run of each
starts with the page cache dropped (root: /proc/sys/vm/drop_caches), so the blocks it reads
from disk (getrusage's ru_inblock) are the bytes of the checkpoint it read: one read is about
its size. Each run's output is deleted after it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import DEFAULT_DIR, real_dims_checkpoint, remove
from safetensors.numpy import save_file

PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
               "mlp": ("gate_proj", "up_proj", "down_proj")}  # fmt: skip


def write_adapter(ckpt: Path, dest: Path, rank: int) -> Path:
    """An adapter of the Norwegian adapter's shape for CKPT, once."""
    if (dest / "adapter_model.safetensors").is_file():
        return dest
    lang = json.loads((ckpt / "config.json").read_text())["language_config"]
    hidden, ffn, heads, kv, hd = (lang[k] for k in ("hidden_size", "intermediate_size",
                                                    "num_attention_heads", "num_key_value_heads",
                                                    "head_dim"))  # fmt: skip
    shapes = {"q_proj": (heads * hd, hidden), "k_proj": (kv * hd, hidden),
              "v_proj": (kv * hd, hidden), "o_proj": (hidden, heads * hd),
              "gate_proj": (ffn, hidden), "up_proj": (ffn, hidden), "down_proj": (hidden, ffn)}
    rng = np.random.default_rng(16)
    tensors = {}
    for layer in range(lang["num_hidden_layers"]):
        for block, names in PROJECTIONS.items():
            for name in names:
                out, inp = shapes[name]
                key = f"base_model.model.language_model.layers.{layer}.{block}.{name}"
                tensors[f"{key}.lora_A.weight"] = \
                    (rng.standard_normal((rank, inp)) / np.sqrt(inp)).astype(np.float32)
                b = rng.standard_normal((out, rank)) * 1e-3 if block == "mlp" else \
                    np.zeros((out, rank))  # fmt: skip
                tensors[f"{key}.lora_B.weight"] = b.astype(np.float32)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, dest / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "use_rslora": False,
              "use_dora": False, "rank_pattern": {}, "alpha_pattern": {},
              "target_modules": [n for names in PROJECTIONS.values() for n in names],
              "base_model_name_or_path": None}  # fmt: skip
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return dest


def timed_run(cmd: list[str], cold: bool, ckpt: Path) -> dict[str, float]:
    """CMD's wall seconds, peak RSS and bytes read from disk; the checkpoint cached first, or
    (COLD) the page cache dropped."""
    os.sync()
    if cold:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    else:
        for shard in ckpt.glob("*.safetensors"):
            with open(shard, "rb") as fh:
                while fh.read(1 << 24):
                    pass
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    os.sync()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return {"wall_s": time.perf_counter() - start, "peak_rss_mb": usage.ru_maxrss / 1024,
            "read_gb": usage.ru_inblock * 512 / 1e9}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--quant", default="Q4_K_M")
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    ckpt = real_dims_checkpoint(DEFAULT_DIR, args.layers)
    adapter = write_adapter(ckpt, DEFAULT_DIR / f"lora-r{args.rank}-{args.layers}layer", args.rank)
    size_gb = sum(p.stat().st_size for p in ckpt.glob("*.safetensors")) / 1e9
    out = DEFAULT_DIR / "lora-out"
    base = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", str(ckpt), "--output",
            str(out), "--file-type", args.quant, "--audio-tokenizer", "none", "--quiet"]
    commands = {"all": base, "all --merge-lora": base + ["--merge-lora", str(adapter)]}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    cold: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            remove(out)
            runs[name].append(timed_run(cmd, False, ckpt))
            remove(out)
    for name, cmd in commands.items():
        remove(out)
        cold[name] = round(timed_run(cmd, True, ckpt)["read_gb"], 3)
        remove(out)
    table = {name: {key: round(statistics.median(r[key] for r in rs), 3)
                    for key in ("wall_s", "peak_rss_mb")} for name, rs in runs.items()}
    a, m = table["all"], table["all --merge-lora"]
    print(json.dumps({"checkpoint_gb": round(size_gb, 3), "layers": args.layers,
                      "quant": args.quant, "rank": args.rank, "rounds": args.rounds,
                      "medians": table, "walls": {k: [round(r["wall_s"], 1) for r in v]
                                                  for k, v in runs.items()},
                      "cold_read_gb": cold,
                      "time_ratio": round(m["wall_s"] / a["wall_s"], 3),
                      "rss_ratio": round(m["peak_rss_mb"] / a["peak_rss_mb"], 3)},
                     indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
