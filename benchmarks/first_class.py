"""`all --format moss-tts-delay` vs OpenMOSS's fork (its converter + its llama-quantize),
alternated, medians and ratio; the outputs are compared byte for byte too.

    FORK_DIR=/path/to/llama.cpp-fork python benchmarks/first_class.py [--rounds 3]
        [--quant Q4_K_M ...] [--layers 2]

FORK_DIR is a checkout of https://github.com/expectqwq/llama.cpp, FORK_BIN the folder of its
built llama-quantize (default FORK_DIR/build/bin); its convert_hf_to_gguf.py runs with its own
gguf-py and needs torch and transformers.

- ours: moss-gguf all --model CKPT --output OUT --format moss-tts-delay --quant T ...
        --audio-tokenizer none   (one read of the checkpoint for every type)
- fork: convert_hf_to_gguf.py CKPT --outtype f16, then llama-quantize f16 → each type

    python benchmarks/first_class.py --dual [--rounds 3] [--quant Q4_K_M ...]

times both dialects instead (no fork needed), alternated, the outputs compared byte for byte:
- joint: all --format backend --format moss-tts-delay   (one read of the checkpoint)
- apart: all --format backend, then all --format moss-tts-delay into OUT/moss-tts-delay
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import sys
from pathlib import Path

from _common import DEFAULT_DIR, measure, real_dims_checkpoint, remove, report


def fork_chain(
    fork: Path, bin_dir: Path, ckpt: Path, out: Path, quants: list[str]
) -> list[list[str]]:
    f16 = out / "fork_f16.gguf"
    cmds = [[sys.executable, str(fork / "convert_hf_to_gguf.py"), str(ckpt), "--outtype", "f16",
             "--outfile", str(f16)]]  # fmt: skip
    for q in quants:
        cmds.append([str(bin_dir / "llama-quantize"), str(f16),
                     str(out / f"fork_{q.lower()}.gguf"), q])  # fmt: skip
    return cmds


def _all(ckpt: Path, out: Path, quants: list[str], *formats: str) -> list[str]:
    cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", str(ckpt), "--output",
           str(out), "--audio-tokenizer", "none", "--quiet"]  # fmt: skip
    cmd += [a for f in formats for a in ("--format", f)]
    return cmd + [a for q in quants for a in ("--quant", q)]


def dual(rounds: int, quants: list[str], layers: int) -> dict:
    """both dialects in one run vs the two formats one after the other, alternated."""
    ckpt = real_dims_checkpoint(DEFAULT_DIR, layers)
    work = DEFAULT_DIR / "dual-bench"
    runs, identical = [], []
    first = "moss-tts-delay"
    for _ in range(rounds):
        remove(work)
        joint, apart = work / "joint", work / "apart"
        runs.append(measure("joint", _all(ckpt, joint, quants, "backend", first), joint))
        r1 = measure("apart", _all(ckpt, apart, quants, "backend"), apart)
        r2 = measure("apart", _all(ckpt, apart / first, quants, first), apart)
        r1.wall, r1.peak_rss_mb = r1.wall + r2.wall, max(r1.peak_rss_mb, r2.peak_rss_mb)
        r1.bytes_written = r2.bytes_written  # the second measured the whole folder
        runs.append(r1)
        names = [f"backbone_{q.lower()}.gguf" for q in quants]
        names += [f"{first}/{first}_{q.lower()}.gguf" for q in quants]
        identical.append(all(filecmp.cmp(joint / n, apart / n, shallow=False) for n in names))
    table = report(runs)
    table["ratio_joint_over_apart"] = (
        table["joint"]["wall_median_s"] / table["apart"]["wall_median_s"]
    )
    table["byte_identical"] = identical
    remove(work)
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quant", action="append", default=None)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dual", action="store_true", help="both dialects vs one by one")
    args = parser.parse_args()
    if args.dual:
        print(json.dumps(dual(args.rounds, args.quant or ["Q4_K_M"], args.layers), indent=2))
        return
    fork = Path(os.environ.get("FORK_DIR", ""))
    if not (fork / "convert_hf_to_gguf.py").is_file():
        raise SystemExit("set FORK_DIR to a built checkout of expectqwq/llama.cpp")
    bin_dir = Path(os.environ.get("FORK_BIN") or fork / "build" / "bin")
    if not (bin_dir / "llama-quantize").is_file():
        raise SystemExit(f"no llama-quantize in {bin_dir}: build the fork, or set FORK_BIN")
    quants = args.quant or ["Q4_K_M"]
    ckpt = real_dims_checkpoint(DEFAULT_DIR, args.layers)
    work = DEFAULT_DIR / "first-class-bench"
    env = {"PYTHONPATH": str(fork / "gguf-py")}
    runs, identical = [], {}
    for _ in range(args.rounds):
        remove(work)
        out = work / "ours"
        ours = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", str(ckpt), "--output",
                str(out), "--format", "moss-tts-delay", "--audio-tokenizer", "none", "--quiet"]
        ours += [a for q in quants for a in ("--quant", q)]
        runs.append(measure("ours", ours, out))
        (work / "fork").mkdir(parents=True)
        cmds = fork_chain(fork, bin_dir, ckpt, work / "fork", quants)
        wall = rss = 0.0
        for cmd in cmds:
            r = measure("fork", cmd, work / "fork", env=env if cmd[0] == sys.executable else None)
            wall, rss = wall + r.wall, max(rss, r.peak_rss_mb)
        r.wall, r.peak_rss_mb = wall, rss
        runs.append(r)
        for q in quants:
            identical[q] = filecmp.cmp(out / f"moss-tts-delay_{q.lower()}.gguf",
                                       work / "fork" / f"fork_{q.lower()}.gguf", shallow=False)
    table = report(runs)
    table["ratio_ours_over_fork"] = table["ours"]["wall_median_s"] / table["fork"]["wall_median_s"]
    table["byte_identical"] = identical
    remove(work)
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
