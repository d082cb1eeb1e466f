"""Native `convert` vs llama.cpp's convert_hf_to_gguf.py on the same backbone, alternated.

    python benchmarks/convert.py [--rounds 3] [--outtype f16] [--llama-cpp DIR]

On the real-dims checkpoint (benchmarks/_common.py; extracted once beside it), runs
A B C A B C …:

- A: `moss-gguf convert EXTRACTED/qwen3_backbone` (native, from the extracted backbone)
- B: `moss-gguf convert CHECKPOINT` (native, straight from the source shards)
- C: `python DIR/convert_hf_to_gguf.py EXTRACTED/qwen3_backbone` (the guide's step 2)

each to completion plus `sync`, output deleted after. Prints median wall time, every wall
time, the peak RSS of each child process (os.wait4), bytes written, and the ratios of the
native medians to llama.cpp's. The tree is --llama-cpp, else $LLAMA_CPP_DIR, else what
scripts/get-llama-cpp.sh prints. Needs ~20 GB free (checked first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _common import DEFAULT_DIR, measure, real_dims_checkpoint, remove, report

REPO = Path(__file__).resolve().parents[1]


def llama_cpp_tree(arg: str | None) -> Path:
    if arg or os.environ.get("LLAMA_CPP_DIR"):
        return Path(arg or os.environ["LLAMA_CPP_DIR"]).expanduser()
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "get-llama-cpp.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def extracted_backbone(model: Path, moss: str) -> Path:
    """The checkpoint's extract output (made once, outside the timings)."""
    out = DEFAULT_DIR / "bench-convert-extracted"
    if not (out / "extraction_meta.json").is_file():
        remove(out)
        subprocess.run([moss, "extract", "--model", str(model), "--output", str(out), "-q"],
                       check=True)  # fmt: skip
    return out / "qwen3_backbone"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--outtype", default="f16", choices=["f16", "bf16", "f32", "q8_0"])
    parser.add_argument("--llama-cpp", default=None)
    args = parser.parse_args()

    print(subprocess.run(["df", "-h", "/tmp"], capture_output=True, text=True).stdout.strip())
    model = real_dims_checkpoint()
    moss = shutil.which("moss-gguf") or sys.exit("moss-gguf is not installed")
    tree = llama_cpp_tree(args.llama_cpp)
    script = tree / "convert_hf_to_gguf.py"
    if not script.is_file():
        sys.exit(f"{script} not found")
    backbone = extracted_backbone(model, moss)
    out = DEFAULT_DIR / f"bench-convert-{args.outtype}.gguf"
    converter_env = {"PYTHONPATH": str(tree / "gguf-py")}

    runs = {
        "native (extracted backbone)": (
            [moss, "convert", str(backbone), "--outfile", str(out), "--outtype", args.outtype,
             "-q"], None,
        ),
        "native (source checkpoint)": (
            [moss, "convert", str(model), "--outfile", str(out), "--outtype", args.outtype,
             "-q"], None,
        ),
        "llama.cpp convert_hf_to_gguf.py": (
            [sys.executable, str(script), str(backbone), "--outfile", str(out), "--outtype",
             args.outtype], converter_env,
        ),
    }  # fmt: skip
    results = []
    for _ in range(args.rounds):
        for name, (cmd, env) in runs.items():
            remove(out)
            results.append(measure(name, cmd, out, env))
            remove(out)
    table = report(results)
    ll = table["llama.cpp convert_hf_to_gguf.py"]["wall_median_s"]
    for name in list(runs)[:2]:
        table[name]["wall_ratio_to_llama_cpp"] = round(table[name]["wall_median_s"] / ll, 3)
    table["outtype"] = args.outtype
    table["checkpoint"] = str(model)
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
