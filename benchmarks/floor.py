"""The memory floor of a synth step against the steps a folder really runs.

    python benchmarks/floor.py --folder W [--steps 120] [--rounds 3]
        [--heads numpy,ggml-f16] [--against /tmp/main-627]

For the weights folder W: the bytes one step in audio must read (every backbone tensor but
the token embedding and the text head's unused rows, plus the audio heads counted at f16:
delay/floor.py) divided by the read bandwidth a NumPy sum over 2 GB reaches (best of 5), taken
again each round, in the same run. Then greedy `synth` steps/s (the profile's: the step loop,
without loading, prefill or audio decoding; after a 40-step warm-up in the same process),
one fresh process per run, for each --heads backend, and with --against a second source
tree (another commit's checkout: its package is the one imported), the runs alternated round
after round so load that drifts touches each alike. Medians; floor/actual per run
(floor ms / ms a step); steps/s against the --against tree's with the same heads.

W should be a speaking folder (serve.py's `speaking_checkpoint`: its text head keeps greedy
decoding in audio, so every step runs the audio heads), e.g. the 2-layer real-dims
checkpoint converted with `moss-gguf all --quant Q4_K_M`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from moss_gguf_cli.delay import SynthConfig
from moss_gguf_cli.delay.floor import read_bandwidth, step_floor

HERE = Path(__file__).resolve().parent.parent

# run in a fresh process under the tree's own package: no import of this tree's code
CHILD = """
import json, sys
from moss_gguf_cli.delay import SynthConfig, Synthesizer
config = SynthConfig.from_yaml(sys.argv[1]).override(heads_backend=sys.argv[2])
greedy = {"text_temperature": 0.0, "audio_temperature": 0.0}
text = "A longer sentence, so that there is enough audio to measure for a while."
with Synthesizer(config) as tts:
    tts.synthesize(text, max_new_tokens=40, sampling=greedy)
    p = tts.synthesize(text, max_new_tokens=int(sys.argv[3]), sampling=greedy).profile
print(json.dumps({"steps": p.steps, "steps_per_s": p.steps_per_s, "frames": p.frames,
                  "backbone_ms": p.per_step_ms("backbone"), "heads_ms": p.per_step_ms("heads"),
                  "heads_backend": p.heads_backend}))
"""


def run(tree: Path, yaml: Path, heads: str, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(yaml), heads, str(steps)],
                          env=env, capture_output=True, text=True, cwd=tree)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"synth failed under {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="a weights folder")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heads", type=lambda v: v.split(","), default=["numpy", "ggml-f16"],
                        help="heads backends to run, comma-separated")  # fmt: skip
    parser.add_argument("--against", type=Path, help="another source tree to alternate with")
    args = parser.parse_args()

    yaml = args.folder / "moss-tts.yaml"
    floor = step_floor(SynthConfig.from_yaml(yaml), bandwidth=1.0)
    trees = {"this": HERE} | ({"against": args.against.resolve()} if args.against else {})
    runs = [(t, h) for t in trees for h in args.heads]
    got: dict[str, list[dict]] = {f"{t} {h}": [] for t, h in runs}
    for _ in range(args.rounds):
        bandwidth = read_bandwidth()
        floor_ms = 1000.0 * floor.step_bytes / bandwidth
        for tree, heads in runs:
            row = run(trees[tree], yaml, heads, args.steps)
            row["floor_ms"] = floor_ms
            row["floor_over_actual"] = floor_ms * row["steps_per_s"] / 1000.0
            got[f"{tree} {heads}"].append(row)
    report: dict = {"folder": str(args.folder), "rounds": args.rounds, "steps": args.steps,
                    "step_bytes": floor.step_bytes, "backbone_bytes": floor.backbone_bytes,
                    "text_rows_bytes": floor.text_rows_bytes,
                    "audio_heads_bytes_f16": floor.audio_heads_bytes}  # fmt: skip
    for name, rows in got.items():
        report[name] = {key: round(statistics.median(r[key] for r in rows), 3)
                        for key in ("steps_per_s", "backbone_ms", "heads_ms", "floor_ms",
                                    "floor_over_actual")}  # fmt: skip
        report[name]["steps_per_s_runs"] = [round(r["steps_per_s"], 2) for r in rows]
        report[name]["heads_backend"] = rows[0]["heads_backend"]
    if args.against:
        for heads in args.heads:
            mine, theirs = report[f"this {heads}"], report[f"against {heads}"]
            mine["vs_against"] = round(mine["steps_per_s"] / theirs["steps_per_s"], 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
