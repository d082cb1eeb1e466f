"""Greedy batch == alone on the real dims: tests/test_tts_engine.py checks it on builtin:tiny;
this checks it on the 2-layer real-dims Q4_K_M folder, whose matmuls take llama.cpp's
repacked K-quant kernels (the tiny model's rows are too narrow for them).

    python benchmarks/batch_parity.py [--folder W] [--max-batch 4]

Four greedy utterances of different lengths: each alone on a --max-batch engine, then all
together, joining at different steps; every generated row must be equal. Also reports how
far a 1-wide engine's rows are from the batched ones (expected to differ: other kernels).
Without --folder it uses serve.py's speaking folder (made once; see serve.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from _common import DEFAULT_DIR
from serve import build_folder

from moss_gguf_cli.delay import SynthConfig, Synthesizer
from moss_gguf_cli.delay.engine import Utterance
from moss_gguf_cli.progress import NullProgress

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
JOBS = [("One.", 40), ("Two words here.", 52), ("A third, longer sentence.", 64),
        ("Four.", 46)]  # fmt: skip


def batched(tts: Synthesizer) -> list[np.ndarray]:
    """The JOBS stepped together: two at first, the third after 5 steps, the fourth once a
    slot is free."""
    made = []
    for text, steps in JOBS:
        rows: list = []
        run = tts.prepare(text, max_new_tokens=steps, sampling=GREEDY)
        made.append((Utterance(run, NullProgress(), rows.append), rows))
    engine = tts.engine
    engine.join(made[0][0])
    engine.join(made[1][0])
    for _ in range(5):
        engine.step()
    engine.join(made[2][0])
    widths = []
    while engine.active:
        late = made[3][0]
        if late.seq < 0 and not late.finished and len(engine.active) == 3 and engine.free:
            engine.join(late)
        widths.append(len(engine.active))
        engine.step()
    print(f"batch widths served: {sorted(set(widths))}")
    return [np.array(rows) for _, rows in made]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--max-batch", type=int, default=4)
    args = parser.parse_args()
    folder = args.folder or build_folder(DEFAULT_DIR, speaking=True)
    config = SynthConfig.from_yaml(folder / "moss-tts.yaml")
    with Synthesizer(config, max_batch=args.max_batch) as tts:
        alone = [tts.synthesize(t, max_new_tokens=n, sampling=GREEDY).rows for t, n in JOBS]
        together = batched(tts)
    with Synthesizer(config, max_batch=1) as tts:
        narrow = [tts.synthesize(t, max_new_tokens=n, sampling=GREEDY).rows for t, n in JOBS]
    pairs = list(zip(alone, together, strict=True))
    narrow_pairs = list(zip(alone, narrow, strict=True))
    report = {
        "max_batch": args.max_batch,
        "rows": [int(a.shape[0]) for a in alone],
        "batched_equal_alone": [bool(np.array_equal(a, b)) for a, b in pairs],
        "one_wide_equal_wide": [bool(np.array_equal(a, b)) for a, b in narrow_pairs],
        "one_wide_rows_differing": [
            int(np.any(a != b, axis=1).sum()) if a.shape == b.shape else -1
            for a, b in narrow_pairs
        ],
    }
    print(json.dumps(report, indent=2))
    raise SystemExit(0 if all(report["batched_equal_alone"]) else 1)


if __name__ == "__main__":
    main()
