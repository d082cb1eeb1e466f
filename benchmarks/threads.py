"""What the thread count does to a speech step: the backbone and the audio heads, 1 and 4 rows.

    python benchmarks/threads.py --folder W [--threads 2,4] [--rounds 3]

For the weights folder W, one backbone (llama.cpp, repacked weights as `synth` and `serve`
run them) and one set of float16 audio heads (ggml, the default) per thread count; 4
sequences prefilled with the same 8 rows; then steps of 1 and 4 rows (the text head skipped,
as in audio) and head products of 1 and 4 rows, each step undone after, the thread counts
alternated round after round (8 timings each a round); the heads also at half the cores (what
they took before). Median and best ms per (part, threads, rows). What `n_threads: 0` (the
physical cores) and the heads' share were chosen by, docs/memory-floor.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from moss_gguf_cli.delay import SynthConfig
from moss_gguf_cli.delay.config import find_model_info
from moss_gguf_cli.delay.heads import AudioHeads
from moss_gguf_cli.native.cpu_features import physical_cores
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

WIDTHS = (1, 4)
REPEAT = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")],
                        help="thread counts (default: the physical cores, and twice that)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cores = physical_cores()
    threads = args.threads or [cores, 2 * cores]
    config = SynthConfig.from_yaml(args.folder / "moss-tts.yaml")
    info = find_model_info(config)
    backbones, heads = {}, {}
    for t in threads:
        settings = BackboneSettings(n_ctx=256, n_threads=t, n_seq=4)
        backbones[t] = Backbone(config.backbone_gguf, settings)
    # the heads also at half the cores: what they took before they took every thread
    for t in sorted({max(1, cores // 2), *threads}):
        heads[t] = AudioHeads(config.lm_head_dir, info.n_vq, info.audio_rows, info.audio_pad_code,
                              backend="ggml-f16", n_threads=t, max_width=max(WIDTHS))  # fmt: skip
    x = np.random.default_rng(0).standard_normal((9, backbones[threads[0]].n_embd))
    x = x.astype(np.float32)
    for bb in backbones.values():
        for seq in range(4):
            bb.prefill(x[:8], seq=seq, logits=False)
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for t in sorted(heads):
            for width in WIDTHS:
                seqs = list(range(width))
                for _ in range(REPEAT):
                    if t in backbones:
                        t0 = time.perf_counter()
                        backbones[t].step_many(np.repeat(x[8:], width, 0), seqs, logits=False,
                                               fixed=False)  # fmt: skip
                        times.setdefault(f"backbone, {t} threads, {width} rows", []).append(
                            time.perf_counter() - t0)  # fmt: skip
                        for seq in seqs:  # undo the step: each round decodes one position
                            backbones[t].reset(seq)
                            backbones[t].prefill(x[:8], seq=seq, logits=False)
                    t0 = time.perf_counter()
                    heads[t].logits_rows(np.repeat(x[8:], width, 0), width)
                    times.setdefault(f"audio heads, {t} threads, {width} rows", []).append(
                        time.perf_counter() - t0)  # fmt: skip
    report: dict = {"folder": str(args.folder), "physical_cores": cores, "rounds": args.rounds}
    for name, got in times.items():
        report[name] = {"median_ms": round(1000 * statistics.median(got), 1),
                        "best_ms": round(1000 * min(got), 1)}  # fmt: skip
    for bb in backbones.values():
        bb.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
