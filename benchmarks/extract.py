"""extract vs `cp -r` of the same checkpoint, alternated, medians and ratios.

    python benchmarks/extract.py [--rounds 3]

Writes the real-dims checkpoint once (benchmarks/_common.py), then runs
A B A B …: `moss-gguf extract` and `cp -r`, each followed by `sync` inside its
timing. Prints wall time, bytes written, peak RSS and the throughput ratio
(extract bytes written per second ÷ cp bytes written per second).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from _common import DEFAULT_DIR, measure, real_dims_checkpoint, remove, report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = real_dims_checkpoint()
    out_extract = DEFAULT_DIR / "bench-extract"
    out_cp = DEFAULT_DIR / "bench-cp"
    moss = shutil.which("moss-gguf") or sys.exit("moss-gguf is not installed")
    runs = []
    for _ in range(args.rounds):
        remove(out_extract)
        runs.append(measure("extract", [moss, "extract", "--model", str(model), "--output",
                                        str(out_extract), "-q"], out_extract))
        remove(out_extract)
        remove(out_cp)
        runs.append(measure("cp -r", ["cp", "-r", str(model), str(out_cp)], out_cp))
        remove(out_cp)
    table = report(runs)
    e, c = table["extract"], table["cp -r"]
    ratio = (e["bytes_written"] / e["wall_median_s"]) / (c["bytes_written"] / c["wall_median_s"])
    table["throughput_ratio_extract_over_cp"] = round(ratio, 3)
    table["wall_ratio_extract_over_cp"] = round(e["wall_median_s"] / c["wall_median_s"], 3)
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
