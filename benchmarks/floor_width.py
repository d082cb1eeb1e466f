"""What the batch's width costs the backbone, with llama.cpp's repacked weights on and off.

    python benchmarks/floor_width.py --folder W [--rounds 7] [--threads 2]

One backbone per setting (repack on: llama.cpp's "extra buffer types", Q4_K interleaved for
its n-row kernels; repack off: the plain ones), 4 sequences each prefilled with the same 8
rows; then steps of width 1, 2 and 4 (the rows served, as `--batch-width served` decodes
them; width 2 is what `identical` gives a lone request), the text head skipped as in audio,
each step undone after, the settings and widths alternated round after round. Reports the
median and best ms a step per (repack, width), and whether sequence 0's hidden state has the
same bits at every width (what `--batch-width identical` relies on: measured, not assumed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from moss_gguf_cli.delay import SynthConfig
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

WIDTHS = (1, 2, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="0: the config's n_threads")
    args = parser.parse_args()
    config = SynthConfig.from_yaml(args.folder / "moss-tts.yaml")
    threads = args.threads or config.n_threads
    backbones = {
        repack: Backbone(config.backbone_gguf, BackboneSettings(
            n_ctx=256, n_threads=threads, n_seq=4, repack=repack))
        for repack in (True, False)
    }  # fmt: skip
    n_embd = backbones[True].n_embd
    x = np.random.default_rng(0).standard_normal((9, n_embd)).astype(np.float32)
    for bb in backbones.values():
        for seq in range(4):
            bb.prefill(x[:8], seq=seq, logits=False)
    times: dict[str, list[float]] = {}
    first: dict[tuple[bool, int], np.ndarray] = {}
    for _ in range(args.rounds):
        for repack, bb in backbones.items():
            for width in WIDTHS:
                seqs = list(range(width))
                t0 = time.perf_counter()
                hidden, _ = bb.step_many(np.repeat(x[8:], width, 0), seqs, logits=False,
                                         fixed=False)  # fmt: skip
                times.setdefault(f"repack {'on' if repack else 'off'}, width {width}",
                                 []).append(1000 * (time.perf_counter() - t0))  # fmt: skip
                first.setdefault((repack, width), hidden[0].copy())
                for seq in seqs:  # undo the step: every round decodes the same position
                    bb.reset(seq)
                    bb.prefill(x[:8], seq=seq, logits=False)
    report: dict = {"folder": str(args.folder), "threads": threads, "rounds": args.rounds}
    for name, got in times.items():
        report[name] = {"median_ms": round(statistics.median(got), 1),
                        "best_ms": round(min(got), 1)}  # fmt: skip
    for repack in (True, False):
        base = first[(repack, 1)]
        report[f"repack {'on' if repack else 'off'}: row bits the same at widths 1/2/4"] = [
            bool(np.array_equal(base, first[(repack, w)])) for w in WIDTHS]  # fmt: skip
        report[f"repack {'on' if repack else 'off'}: largest difference from width 1"] = float(
            max(np.abs(base - first[(repack, w)]).max() for w in WIDTHS))  # fmt: skip
    for bb in backbones.values():
        bb.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
