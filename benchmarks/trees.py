"""The same `moss-gguf all` from two commits of this repository, alternated: medians and ratio.

    python benchmarks/trees.py BEFORE AFTER [--rounds 3] [--file-type Q4_K_M] [--layers 2]
        [--model builtin:tiny] [--format backend --format moss-tts-delay]

BEFORE and AFTER are commits (or branches); each is exported with `git archive` to a temporary
folder and run as `python -m moss_gguf_cli` with that folder first on PYTHONPATH, on the
real-dims checkpoint (_common.real_dims_checkpoint) or --model, without a codec (offline, and
not what is measured). For a change meant to keep behaviour (a refactor), the outputs must also
be byte-identical: the sha256 of every file each run made (manifest.json files aside, they
record the tool's version) and of every file each manifest lists are compared.
"""

from __future__ import annotations

import argparse
import hashlib
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
    """Every file under OUTPUT by its sha256, and every manifest's entries (both formats' folders
    when a run writes both)."""
    found = {}
    for path in sorted(output.rglob("*")):
        rel = path.relative_to(output).as_posix()
        if path.is_file() and path.name != "manifest.json":
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.name == "manifest.json":
            for f in json.loads(path.read_text())["files"]:
                found[f"{rel}: {f['path']}"] = f["sha256"]
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--file-type", "--quant", dest="file_types", action="append")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--model", help="a checkpoint or builtin:tiny (default: the real-dims one)")
    ap.add_argument("--format", dest="formats", action="append", default=[])
    args = ap.parse_args()
    model = args.model or real_dims_checkpoint(DEFAULT_DIR, args.layers)
    file_types = args.file_types or ["Q4_K_M"]
    with tempfile.TemporaryDirectory(dir=None if args.model else DEFAULT_DIR) as tmp:
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
                for t in file_types:
                    cmd += ["--quant", t]  # the spelling both trees accept
                for f in args.formats:
                    cmd += ["--format", f]
                run = measure(name, cmd, out, env={"PYTHONPATH": str(trees[name])})
                walls[name].append(run.wall)
                outputs[name] = digests(out)
                shutil.rmtree(out)
                print(f"round {i + 1} {name}: {run.wall:.1f} s, peak RSS {run.peak_rss_mb:.0f} MB")
        med = {name: statistics.median(w) for name, w in walls.items()}
        same = outputs["before"] == outputs["after"]
        differ = sorted(k for k in outputs["before"].keys() | outputs["after"].keys()
                        if outputs["before"].get(k) != outputs["after"].get(k))  # fmt: skip
        print(f"{len(outputs['after'])} files and manifest entries compared; differing: {differ}")
        print(f"median before {med['before']:.1f} s, after {med['after']:.1f} s, "
              f"after/before {med['after'] / med['before']:.3f}; outputs identical: {same}")


if __name__ == "__main__":
    main()
