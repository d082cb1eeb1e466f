"""The batched engine (tts/engine.py): utterances of different lengths joining and leaving a
shared llama.cpp context give each the rows it gets alone (the engine is always max_batch rows
wide, so a lone utterance takes the same kernels as a batched one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moss_gguf_cli.progress import NullProgress
from moss_gguf_cli.tts import SynthConfig, Synthesizer
from moss_gguf_cli.tts.engine import Utterance

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
JOBS = [("One.", 40), ("Two words here.", 52), ("A third, longer sentence.", 64),
        ("Four.", 46)]  # fmt: skip


@pytest.fixture(scope="module")
def wide(tiny_weights: Path):
    with Synthesizer(SynthConfig.from_yaml(tiny_weights / "moss-tts.yaml"), max_batch=4) as tts:
        yield tts


def utterance(tts: Synthesizer, text: str, steps: int) -> tuple[Utterance, list]:
    rows: list = []
    run = tts.prepare(text, max_new_tokens=steps, sampling=GREEDY)
    return Utterance(run, NullProgress(), rows.append), rows


def test_batched_greedy_rows_equal_each_alone(wide):
    alone = [wide.synthesize(text, max_new_tokens=n, sampling=GREEDY).rows for text, n in JOBS]
    made = [utterance(wide, text, n) for text, n in JOBS]
    engine = wide.engine
    engine.join(made[0][0])
    engine.join(made[1][0])
    for _ in range(5):  # the others join later, between steps
        engine.step()
    engine.join(made[2][0])
    widths = []
    while engine.active:
        if made[3][0].seq < 0 and not made[3][0].finished and len(engine.active) == 3:
            engine.join(made[3][0])
        widths.append(len(engine.active))
        engine.step()
    assert max(widths) == 4 and min(widths) == 1  # served 1, 2, 3 and 4 at once
    for (u, rows), expected in zip(made, alone, strict=True):
        assert u.error is None and u.finished
        np.testing.assert_array_equal(np.array(rows), expected)
    assert engine.free == [0, 1, 2, 3]  # every sequence freed when its utterance ended
