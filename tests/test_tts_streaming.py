"""Streaming (tts/streaming.py, Synthesizer.stream): windows decoded with the context the real
ONNX decoder needs equal the whole decode; the reach is measured on the graph itself, both on
the tiny frame-local decoder and on a causal one that mixes two frames back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from moss_gguf_cli.delay import SynthConfig, Synthesizer
from moss_gguf_cli.tts.codec import FRAME_SAMPLES, SAMPLE_RATE, AudioCodec, loudness_gain
from moss_gguf_cli.tts.streaming import (
    ReceptiveField,
    StreamSettings,
    WindowDecoder,
    probe_receptive_field,
)

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
# float32 decodes of different lengths may sum in another order: a few ulps of a ±0.5 signal
TOLERANCE = 1e-5


def causal_decoder(path: Path, taps: tuple[float, ...] = (1.0, 0.5, 0.25)) -> Path:
    """An ONNX decoder with the audio tokenizer's contract whose frame t mixes the projections
    of frames t, t−1, ..., t−len(taps)+1: a causal decoder with a bounded reach."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    back = len(taps) - 1
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((32, FRAME_SAMPLES)).astype(np.float32) / 64
    nodes = [
        helper.make_node("Cast", ["codes"], ["codes_f"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["codes_f"], ["btk"], perm=[1, 2, 0]),
        helper.make_node("MatMul", ["btk", "w"], ["frames"]),  # (B, T, 1920)
        helper.make_node("Pad", ["frames", "pads"], ["padded"]),  # `back` zero frames first
    ]
    terms = []
    for lag in range(len(taps)):  # padded[back − lag : T + back − lag] is frame t − lag
        nodes += [
            helper.make_node("Shape", ["frames"], [f"shape{lag}"]),
            helper.make_node("Gather", [f"shape{lag}", "one"], [f"t{lag}"], axis=0),
            helper.make_node("Add", [f"t{lag}", f"end{lag}"], [f"stop{lag}"]),
            helper.make_node("Slice", ["padded", f"start{lag}", f"stop{lag}", "axis1"],
                             [f"lag{lag}"]),  # fmt: skip
            helper.make_node("Mul", [f"lag{lag}", f"tap{lag}"], [f"term{lag}"]),
        ]
        terms.append(f"term{lag}")
    nodes += [
        helper.make_node("Sum", terms, ["mixed"]),
        helper.make_node("Reshape", ["mixed", "audio_shape"], ["audio"]),
    ]
    inits = [
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(np.array([0, back, 0, 0, 0, 0], np.int64), "pads"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([0, 1, -1], np.int64), "audio_shape"),
    ]
    for lag, tap in enumerate(taps):
        inits += [
            numpy_helper.from_array(np.array([back - lag], np.int64), f"start{lag}"),
            numpy_helper.from_array(np.array([back - lag], np.int64), f"end{lag}"),
            numpy_helper.from_array(np.array(tap, np.float32), f"tap{lag}"),
        ]
    graph = helper.make_graph(
        nodes, "causal_decoder",
        [helper.make_tensor_value_info("codes", TensorProto.INT64, [32, "b", "t"]),
         helper.make_tensor_value_info("n_quantizers", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["b", 1, "n"])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def stream_decode(codec: AudioCodec, reach: ReceptiveField, codes: np.ndarray,
                  settings: StreamSettings) -> list[np.ndarray]:  # fmt: skip
    decoder = WindowDecoder(codec, reach, settings)
    chunks = [decoder.push(frame) for frame in codes]
    chunks.append(decoder.end_segment())
    return [c for c in chunks if c is not None]


@pytest.fixture(scope="module")
def tts(tiny_weights: Path):
    with Synthesizer(SynthConfig.from_yaml(tiny_weights / "moss-tts.yaml")) as synthesizer:
        yield synthesizer


def test_the_reach_is_measured_on_the_graph(tts, tmp_path):
    assert tts.receptive_field() == ReceptiveField(left=0, right=0)  # the tiny one: frame-local
    causal = AudioCodec(causal_decoder(tmp_path / "causal.onnx"), n_vq=32)
    assert probe_receptive_field(causal, 1024) == ReceptiveField(left=2, right=0)


@pytest.mark.parametrize("settings", [StreamSettings(1, 3), StreamSettings(2, 8)])
def test_windows_with_the_measured_context_equal_the_whole_decode(tmp_path, settings):
    codec = AudioCodec(causal_decoder(tmp_path / "causal.onnx"), n_vq=32)
    codes = np.random.default_rng(3).integers(0, 1024, size=(21, 32))
    whole = codec.decode(codes)
    chunks = stream_decode(codec, probe_receptive_field(codec, 1024), codes, settings)
    assert chunks[0].size == settings.first_window * FRAME_SAMPLES and len(chunks) > 2
    streamed = np.concatenate(chunks)
    assert streamed.shape == whole.shape
    assert np.max(np.abs(streamed - whole)) <= TOLERANCE
    # without the context the windows' edges are wrong: the check above can fail
    blind = np.concatenate(stream_decode(codec, ReceptiveField(0, 0), codes, settings))
    assert np.max(np.abs(blind - whole)) > 100 * TOLERANCE


def test_windows_after_a_context_equal_the_whole_decode_after_it(tmp_path):
    """A continuation (a TTSD dialogue continues its speakers' joined clips): each window is
    decoded after the context frames and they are cut off, as Synthesizer.decode_raw does;
    without the context the first windows are wrong."""
    codec = AudioCodec(causal_decoder(tmp_path / "causal.onnx"), n_vq=32)
    rng = np.random.default_rng(5)
    context, codes = rng.integers(0, 1024, size=(6, 32)), rng.integers(0, 1024, size=(13, 32))
    whole = codec.decode(np.concatenate([context, codes]))[context.shape[0] * FRAME_SAMPLES :]
    reach, settings = probe_receptive_field(codec, 1024), StreamSettings(1, 3)
    decoder = WindowDecoder(codec, reach, settings, context)
    chunks = [decoder.push(frame) for frame in codes] + [decoder.end_segment()]
    streamed = np.concatenate([c for c in chunks if c is not None])
    assert streamed.shape == whole.shape
    assert np.max(np.abs(streamed - whole)) <= TOLERANCE
    blind = np.concatenate(stream_decode(codec, reach, codes, settings))
    assert np.max(np.abs(blind - whole)) > 100 * TOLERANCE


def test_stream_equals_synthesize(tts):
    whole = tts.synthesize("Streaming, one window at a time.", seed=1, sampling=GREEDY)
    # the random tiny model speaks a few frames only: one-frame windows
    settings = StreamSettings(first_window=1, window=1)
    chunks = list(tts.stream("Streaming, one window at a time.", window=settings, seed=1,
                             sampling=GREEDY))  # fmt: skip
    assert len(chunks) == whole.profile.frames > 1 and chunks[0].size == FRAME_SAMPLES
    streamed = np.concatenate(chunks)
    assert streamed.shape == whole.waveform.shape
    # the gain is fixed on the first window (the whole utterance is not known yet): undo both
    # gains, then the decoded samples are the same
    raw_whole = np.concatenate([tts.codec.decode(s) for s in whole.codes])
    held = loudness_gain(raw_whole[:FRAME_SAMPLES])
    assert np.max(np.abs(streamed / held - raw_whole)) <= TOLERANCE
    np.testing.assert_array_equal(tts.last_result.rows, whole.rows)
    assert tts.last_profile.frames == whole.profile.frames


def synth(weights: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "moss_gguf_cli", "synth", "--config",
           str(weights / "moss-tts.yaml"), "--text", "Hello there.", "--seed", "3", "-q", *args]
    return subprocess.run(cmd, capture_output=True, check=True, timeout=300)  # fmt: skip


def test_cli_streams_pcm_to_stdout_and_a_wav_file(tiny_weights, tmp_path):
    whole, rate = sf.read(str(tmp_path / synth(tiny_weights, "-o", str(tmp_path / "w.wav"))
                              .stdout.decode().strip()), dtype="int16")  # fmt: skip
    piped = synth(tiny_weights, "--stream", "--output", "-").stdout
    samples = np.frombuffer(piped, dtype="<i2")  # what `aplay -f S16_LE -r 24000` plays
    assert samples.size == whole.size and samples.size % FRAME_SAMPLES == 0
    assert np.max(np.abs(samples.astype(np.int32) - whole)) <= 1  # the held gain (docs: serve)
    wav = tmp_path / "s.wav"
    assert synth(tiny_weights, "--stream", "-o", str(wav)).stdout.decode().strip() == str(wav)
    data, rate = sf.read(str(wav), dtype="int16")  # a plain header: its sizes filled in
    assert rate == SAMPLE_RATE and np.array_equal(data, samples)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.wav", "w.wav"]  # no temporary left
