"""The same `moss-gguf all` from two commits of this repository, alternated: medians and ratio.

    python benchmarks/trees.py BEFORE AFTER [--rounds 3] [--quant Q4_K_M] [--layers 2]

BEFORE and AFTER are commits (or branches); each is exported with `git archive` to a temporary
folder and run as `python -m moss_gguf_cli` with that folder first on PYTHONPATH, on the
real-dims checkpoint (_common.real_dims_checkpoint), without a codec (offline, and not what
is measured). For a change meant to keep behaviour
(a refactor), the outputs must also be byte-identical: the two runs' manifests are compared.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import DEFAULT_DIR, measure, real_dims_checkpoint

REPO = Path(__file__).resolve().parent.parent


def export(commit: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def digests(output: Path) -> dict[str, str]:
    manifest = json.loads((output / "manifest.json").read_text())
    return {f["path"]: f["sha256"] for f in manifest["files"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quant", action="append")
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    model = real_dims_checkpoint(DEFAULT_DIR, args.layers)
    quants = args.quant or ["Q4_K_M"]
    with tempfile.TemporaryDirectory(dir=DEFAULT_DIR) as tmp:
        root = Path(tmp)
        trees = {name: export(c, root / name) for name, c in
                 (("before", args.before), ("after", args.after))}  # fmt: skip
        walls: dict[str, list[float]] = {name: [] for name in trees}
        outputs: dict[str, dict[str, str]] = {}
        for i in range(args.rounds):
            order = list(trees) if i % 2 == 0 else list(trees)[::-1]
            for name in order:
                out = root / f"out-{name}"
                cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", str(model),
                       "--output", str(out), "--audio-tokenizer", "none", "--quiet"]  # fmt: skip
                for q in quants:
                    cmd += ["--quant", q]
                run = measure(name, cmd, out, env={"PYTHONPATH": str(trees[name])})
                walls[name].append(run.wall)
                outputs[name] = digests(out)
                shutil.rmtree(out)
                print(f"round {i + 1} {name}: {run.wall:.1f} s, peak RSS {run.peak_rss_mb:.0f} MB")
        med = {name: statistics.median(w) for name, w in walls.items()}
        same = outputs["before"] == outputs["after"]
        print(f"median before {med['before']:.1f} s, after {med['after']:.1f} s, "
              f"after/before {med['after'] / med['before']:.3f}; outputs identical: {same}")


if __name__ == "__main__":
    main()
