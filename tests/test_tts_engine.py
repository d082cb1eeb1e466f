"""The batched engine (delay/engine.py): utterances of different lengths joining and leaving a
shared llama.cpp context give each the rows it gets alone (the engine is always max_batch rows
wide, so a lone utterance takes the same kernels as a batched one, and each sequence keeps its
row). On the f16 backbone and on a Q4_K_M one: llama.cpp's K-quant kernels are where a row's
bits depend on the batch around it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moss_gguf_cli.delay import SynthConfig, Synthesizer
from moss_gguf_cli.delay.engine import Utterance
from moss_gguf_cli.progress import NullProgress

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
JOBS = [("One.", 40), ("Two words here.", 52), ("A third, longer sentence.", 64),
        ("Four.", 46)]  # fmt: skip


@pytest.fixture(scope="module", params=["f16", "q4_k_m"])
def wide(request, tiny_weights: Path):
    folder = tiny_weights if request.param == "f16" else request.getfixturevalue("q4_weights")
    with Synthesizer(SynthConfig.from_yaml(folder / "moss-tts.yaml"), max_batch=4) as tts:
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


def test_a_sequences_row_does_not_depend_on_the_batch_around_it(q4_weights: Path):
    """The same state in any sequence, alone or beside others in any order, gives the same
    bits (llama.cpp computes a batch whose sequences come out of order differently)."""
    from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

    rng = np.random.default_rng(0)
    with Backbone(q4_weights / "backbone_q4_k_m.gguf",
                  BackboneSettings(n_ctx=256, n_threads=2, n_seq=4)) as bb:  # fmt: skip
        prompt = rng.standard_normal((24, bb.n_embd)).astype(np.float32) * 0.02
        row = rng.standard_normal((1, bb.n_embd)).astype(np.float32) * 0.02

        def served(seqs: list[int]) -> list[np.ndarray]:
            bb.reset()
            for seq in seqs:
                bb.prefill(prompt, seq=seq)
            hidden, logits = bb.step_many(np.repeat(row, len(seqs), axis=0), seqs)
            return [np.concatenate([hidden[i], logits[i]]) for i in range(len(seqs))]

        first = served([0])[0]
        for seqs in ([1], [2, 0], [3, 1, 0], [0, 1, 2, 3]):
            for got in served(seqs):
                np.testing.assert_array_equal(got, first, err_msg=f"sequences {seqs}")


def test_a_failing_utterance_ends_alone(wide):
    """docs/ARCHITECTURE.md §10: one utterance's failure (here its consumer of rows) ends it
    alone, in the step it failed; the one beside it gets the rows it gets alone."""
    text, steps = JOBS[1]
    alone = wide.synthesize(text, max_new_tokens=steps, sampling=GREEDY).rows
    good, rows = utterance(wide, text, steps)

    def broken(_row) -> None:
        raise RuntimeError("the consumer failed")

    bad = Utterance(wide.prepare("One.", max_new_tokens=40, sampling=GREEDY), NullProgress(),
                    broken)  # fmt: skip
    engine = wide.engine
    engine.join(good)
    engine.join(bad)
    before = engine.last_progress
    assert engine.step() == [bad]
    assert bad.finished and isinstance(bad.error, RuntimeError)
    assert engine.last_progress > before
    while engine.active:
        engine.step()
    assert good.error is None
    np.testing.assert_array_equal(np.array(rows), alone)
    assert engine.free == [0, 1, 2, 3]
