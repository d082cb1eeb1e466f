"""What a step reads (ARCHITECTURE.md §10, docs/memory-floor.md): the backbone stops at the
hidden state unless a row samples the whole vocabulary, the text head gives the logits of
the plan's ids in llama.cpp's own bits, and the batch's width policies keep what they promise.
On builtin:tiny as an f16 backbone and as a Q4_K_M one (its head Q6_K, its layers repacked)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from test_tts_engine import JOBS, utterance

from moss_gguf_cli.delay import SynthConfig, Synthesizer
from moss_gguf_cli.delay.config import ModelInfo
from moss_gguf_cli.delay.engine import EngineSettings
from moss_gguf_cli.delay.pattern import DelayMachine
from moss_gguf_cli.delay.text_head import TextHead
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}

# sha256[:16] of the generated rows (int64) of `digests` below, made by main 627a995 (the
# code before the text head: llama.cpp's whole head every step) on the same builtin:tiny
# folders: `git worktree add /tmp/main-627 627a995`, then in this tree
# `PYTHONPATH=/tmp/main-627 python -c "import sys; sys.path[:0] = ['tests'];
# from test_text_head import digests; print(digests(sys.argv[1]))" FOLDER`
# for the tiny_weights and q4_weights fixtures' folders (float32 heads: heads_backend numpy)
GOLDEN = {
    "f16": ["a55b17d7538a37e9", "56dd7181d492c228"],
    "q4": ["80f64feac2e79822", "4a508692f271f35f"],
}


def digests(folder: str | Path) -> list[str]:
    """A greedy utterance and a sampled one (seed 7: it leaves audio, so steps sample the
    whole vocabulary too), float32 heads; runs under any commit's Synthesizer."""
    config = SynthConfig.from_yaml(Path(folder) / "moss-tts.yaml").override(heads_backend="numpy")
    out = []
    with Synthesizer(config) as tts:
        for text, options in (("Hello there.", {"sampling": GREEDY}),
                              ("A second sentence, sampled.", {"seed": 7})):  # fmt: skip
            rows = tts.synthesize(text, max_new_tokens=48, **options).rows
            out.append(hashlib.sha256(np.ascontiguousarray(rows, np.int64).tobytes()).hexdigest())
    return [d[:16] for d in out]


@pytest.fixture(scope="module", params=["f16", "q4"])
def folder(request, tiny_weights: Path) -> tuple[str, Path]:
    return request.param, (tiny_weights if request.param == "f16"
                           else request.getfixturevalue("q4_weights"))  # fmt: skip


def test_f32_heads_give_main_627a995s_rows(folder):
    kind, path = folder
    assert digests(path) == GOLDEN[kind]


def _gguf(path: Path) -> Path:
    return SynthConfig.from_yaml(path / "moss-tts.yaml").backbone_gguf


def test_text_head_gives_llama_cpps_bits(folder):
    """The logits of any ids, from the prefill's final chunk, a 1-row step and a 3-row
    batch, equal llama.cpp's whole head's at those ids, bit for bit."""
    _, path = folder
    gguf = _gguf(path)
    head = TextHead(gguf)
    rng = np.random.default_rng(4)
    ids = np.unique(np.r_[0, head.n_vocab - 1, rng.integers(0, head.n_vocab, 30)])
    x = (rng.standard_normal((9, head.cols)) * 2.0).astype(np.float32)
    settings = BackboneSettings(n_ctx=64, n_batch=16, n_threads=1, n_seq=4)
    with Backbone(gguf, settings) as bb:
        for seq in range(3):
            hidden, logits = bb.prefill(x[: 5 + seq], seq=seq)
            got = head.logits(hidden, ids, width=bb.width)
            np.testing.assert_array_equal(got[0], logits[ids])
        hidden, logits = bb.step_many(x[5:6], [1], fixed=False)
        assert bb.width == 1
        np.testing.assert_array_equal(head.logits(hidden, ids, width=1), logits[:, ids])
        hidden, logits = bb.step_many(x[6:9], [2, 0, 1], fixed=False)
        assert bb.width == 3
        np.testing.assert_array_equal(head.logits(hidden, ids, width=3), logits[:, ids])


def test_a_step_without_whole_vocabulary_stops_before_the_head(folder):
    _, path = folder
    x = (np.random.default_rng(5).standard_normal((6, 256)) * 2.0).astype(np.float32)
    runs = {}
    for logits in (True, False):
        with Backbone(_gguf(path), BackboneSettings(n_ctx=64, n_threads=1)) as bb:
            bb.prefill(x[:5], logits=logits)
            hidden, text = bb.step(x[5], logits=logits)
            runs[logits] = (hidden.copy(), text, bb.head_skipped)
    assert runs[False][1] is None and runs[False][2]  # stopped at the hidden state
    assert runs[True][1].shape == (151936,) and not runs[True][2]
    np.testing.assert_array_equal(runs[False][0], runs[True][0])


def test_the_plan_names_the_text_ids_a_step_reads():
    info = ModelInfo(n_vq=4)
    prompt = np.full((3, 5), info.audio_pad_code, dtype=np.int64)
    prompt[:, 0] = [1, 2, info.audio_start_token_id]
    machine = DelayMachine(info, prompt)
    assert machine.plan().text_ids.size == 0  # step 0 in audio: the gen slot, no logit
    gen, delay = info.audio_assistant_gen_slot_token_id, info.audio_assistant_delay_slot_token_id
    machine.advance(gen, np.zeros(1, np.int64), machine.plan())
    assert machine.plan().text_ids.tolist() == [gen, delay]
    machine.advance(delay, np.zeros(2, np.int64), machine.plan())
    assert machine.plan().forced_text == delay and machine.plan().text_ids.size == 0
    outside = DelayMachine(info, prompt[:2])
    assert outside.plan().text_ids is None  # outside audio: the whole vocabulary


def _batched(tts: Synthesizer) -> list[np.ndarray]:
    made = [utterance(tts, text, n) for text, n in JOBS]
    engine = tts.engine
    engine.join(made[0][0])
    for _ in range(3):
        engine.step()
    engine.join(made[1][0])
    engine.join(made[2][0])
    while engine.active:
        if made[3][0].seq < 0 and not made[3][0].finished and engine.free:
            engine.join(made[3][0])
        engine.step()
    return [np.array(rows) for _, rows in made]


@pytest.mark.parametrize("heads", ["numpy", "ggml-f16"])
def test_identical_width_gives_each_utterance_its_rows_alone(folder, heads):
    """width "identical": as wide as served (never 1 row), weights not repacked — greedy
    rows batched equal the same utterance alone on the same engine."""
    _, path = folder
    config = SynthConfig.from_yaml(path / "moss-tts.yaml")
    with Synthesizer(config, max_batch=4,
                     settings=EngineSettings(width="identical", heads=heads)) as tts:  # fmt: skip
        alone = [tts.synthesize(t, max_new_tokens=n, sampling=GREEDY).rows for t, n in JOBS]
        together = _batched(tts)
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_lone_request_on_a_served_width_engine_is_the_1_wide_engines(folder):
    _, path = folder
    config = SynthConfig.from_yaml(path / "moss-tts.yaml")
    rows = {}
    for width in (1, 4):
        with Synthesizer(config, max_batch=width) as tts:
            rows[width] = tts.synthesize("Hello there.", max_new_tokens=40, sampling=GREEDY).rows
    np.testing.assert_array_equal(rows[1], rows[4])


def test_serve_refuses_an_unknown_batch_width(tiny_weights: Path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "serve", "--config",
                           str(tiny_weights / "moss-tts.yaml"), "--batch-width", "wide"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--batch-width must be one of served, identical, fixed" in done.stderr


def test_float32_heads_of_several_rows_are_one_product_with_rows_of_their_own(tiny_weights):
    """An engine stepping several rows keeps its float32 stack in ggml: one row is NumPy's
    sgemv (the 1-wide engine's bits), several one tinyBLAS product whose rows do not
    depend on the rows beside them."""
    from moss_gguf_cli.delay.heads import AudioHeads, load_stacked

    lm_heads = SynthConfig.from_yaml(tiny_weights / "moss-tts.yaml").lm_head_dir
    heads = AudioHeads(lm_heads, 32, 1025, 1024, backend="numpy", n_threads=1, max_width=4)
    stacked = load_stacked(lm_heads, 32, 1025, np.float32)
    hidden = np.random.default_rng(8).standard_normal((4, 256)).astype(np.float32)
    one = heads.logits_rows(hidden[:1], 1)[0]
    np.testing.assert_array_equal(one[:, :1024], (stacked @ hidden[0]).reshape(32, 1025)[:, :1024])
    four = heads.logits_rows(hidden, 4)
    np.testing.assert_array_equal(heads.logits_rows(hidden[2:3], 2)[0], four[2])
    np.testing.assert_allclose(four[0], one, rtol=1e-5, atol=1e-5)
    assert np.isneginf(four[:, :, 1024]).all()
    heads.close()
