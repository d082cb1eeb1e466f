"""The audio tokenizer contract (tiny ONNX codec via onnxruntime) and the audio helpers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import soundfile as sf

from moss_gguf_cli.errors import InputError
from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec, write_tiny_codec
from moss_gguf_cli.tts.codec import (
    FRAME_SAMPLES,
    AudioCodec,
    loudness_normalize,
    read_reference,
    resample,
)


@pytest.fixture(scope="module")
def codec_dir(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("codec") / "audio_tokenizer"
    ensure_tiny_codec(dest)
    return dest


def _noise(seconds: float, rate: int = 24000, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * rate)) * 0.1).astype(
        np.float32
    )


def test_tiny_codec_has_the_real_contract(codec_dir):
    encoder = ort.InferenceSession(str(codec_dir / "encoder.onnx"))
    decoder = ort.InferenceSession(str(codec_dir / "decoder.onnx"))
    e_in, e_out = encoder.get_inputs(), encoder.get_outputs()
    d_in, d_out = decoder.get_inputs(), decoder.get_outputs()
    assert [(a.type, len(a.shape)) for a in e_in] == [("tensor(float)", 3), ("tensor(int64)", 0)]
    assert [(a.type, len(a.shape)) for a in e_out] == [("tensor(int64)", 3), ("tensor(int64)", 1)]
    assert [(a.type, len(a.shape)) for a in d_in] == [("tensor(int64)", 3), ("tensor(int64)", 0)]
    assert [(a.type, len(a.shape)) for a in d_out] == [("tensor(float)", 3), ("tensor(int64)", 1)]
    assert d_in[0].shape[0] == 32 and e_out[0].shape[0] == 32
    # batch of 2, 3 frames: codes (32, B, T) in 0..1023, audio (B, 1, T·1920), lengths (B,)
    audio = np.stack([_noise(0.24, seed=1), _noise(0.24, seed=2)])[:, None, :]
    codes, lengths = encoder.run(
        None, {e_in[0].name: audio, e_in[1].name: np.array(32, dtype=np.int64)}
    )
    assert codes.shape == (32, 2, 3) and codes.dtype == np.int64
    assert 0 <= codes.min() and codes.max() < 1024 and lengths.tolist() == [3, 3]
    wav, wav_lengths = decoder.run(
        None, {d_in[0].name: codes, d_in[1].name: np.array(32, dtype=np.int64)}
    )
    assert wav.shape == (2, 1, 3 * FRAME_SAMPLES) and wav.dtype == np.float32
    assert wav_lengths.tolist() == [3 * FRAME_SAMPLES] * 2
    # the weights live in external .data files
    assert (codec_dir / "decoder.onnx.data").stat().st_size > 100_000
    assert (codec_dir / "decoder.onnx").stat().st_size < 10_000


def test_ensure_tiny_codec_is_deterministic_and_cached(codec_dir, tmp_path):
    again = ensure_tiny_codec(codec_dir)
    assert again == (codec_dir / "encoder.onnx", codec_dir / "decoder.onnx")
    other_enc, other_dec = write_tiny_codec(tmp_path / "other")
    assert other_dec.read_bytes() == (codec_dir / "decoder.onnx").read_bytes()
    assert (tmp_path / "other" / "decoder.onnx.data").read_bytes() == (
        codec_dir / "decoder.onnx.data"
    ).read_bytes()


@pytest.mark.parametrize("external", [True, False])
def test_encode_decode_roundtrip_shapes(tmp_path, external):
    enc, dec = write_tiny_codec(tmp_path / "c", external_data=external)
    assert (tmp_path / "c" / "decoder.onnx.data").exists() == external
    codec = AudioCodec(dec, enc, n_vq=32)
    wav = _noise(1.0)  # 24000 samples: padded to 13 frames
    codes = codec.encode(wav)
    assert codes.shape == (math.ceil(24000 / FRAME_SAMPLES), 32)
    assert codes.dtype == np.int64 and codes.min() >= 0 and codes.max() < 1024
    out = codec.decode(codes)
    assert out.shape == (codes.shape[0] * FRAME_SAMPLES,) and out.dtype == np.float32
    np.testing.assert_array_equal(codec.decode(codes), out)  # deterministic


def test_fewer_codebooks_pad_to_32_and_pass_n_quantizers(codec_dir):
    full = AudioCodec(codec_dir / "decoder.onnx", codec_dir / "encoder.onnx", n_vq=32)
    half = AudioCodec(codec_dir / "decoder.onnx", codec_dir / "encoder.onnx", n_vq=16)
    wav = _noise(0.5)
    codes32, codes16 = full.encode(wav), half.encode(wav)
    assert codes16.shape == (codes32.shape[0], 16)
    np.testing.assert_array_equal(codes16, codes32[:, :16])
    # decoding 16 codebooks = decoding 32 whose last 16 are ignored (n_quantizers=16)
    wav16 = half.decode(codes16)
    masked = codes32.copy()
    masked[:, 16:] = 0
    assert wav16.shape == (codes16.shape[0] * FRAME_SAMPLES,)
    assert not np.array_equal(wav16, full.decode(codes32))
    feeds = {
        full._decoder.get_inputs()[0].name: masked.T[:, None, :].copy(),
        full._decoder.get_inputs()[1].name: np.array(16, dtype=np.int64),
    }
    np.testing.assert_allclose(wav16, full._decoder.run(None, feeds)[0].reshape(-1), rtol=1e-6)


def test_decoder_with_the_wrong_signature(codec_dir):
    with pytest.raises(InputError, match="wrong signature"):
        AudioCodec(codec_dir / "encoder.onnx")  # an encoder where the decoder should be


def test_decoder_with_three_inputs_is_refused(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["codes"], ["audio"], to=TensorProto.FLOAT)],
        "bad",
        [
            helper.make_tensor_value_info("codes", TensorProto.INT64, [32, 1, "t"]),
            helper.make_tensor_value_info("n_q", TensorProto.INT64, []),
            helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [32, 1, "t"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(tmp_path / "decoder.onnx"))
    with pytest.raises(InputError, match="wrong signature"):
        AudioCodec(tmp_path / "decoder.onnx")


def test_missing_and_broken_onnx(tmp_path):
    with pytest.raises(InputError, match="not found"):
        AudioCodec(tmp_path / "nothing.onnx")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    with pytest.raises(InputError, match="cannot load"):
        AudioCodec(tmp_path / "broken.onnx")


def test_encoder_needed_for_a_reference(codec_dir):
    codec = AudioCodec(codec_dir / "decoder.onnx", None)
    with pytest.raises(InputError, match="encoder"):
        codec.encode(_noise(0.1))


def _tone(freq: float, rate: int, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("rate", [44100, 16000, 48000, 22050])
def test_resample_keeps_a_tone(rate):
    out = resample(_tone(1000.0, rate), rate, 24000)
    assert abs(out.size - 0.5 * 24000) <= 1
    spectrum = np.abs(np.fft.rfft(out * np.hanning(out.size)))
    peak_hz = np.argmax(spectrum) * 24000 / out.size
    assert abs(peak_hz - 1000.0) < 5
    middle = out[2000:-2000]
    assert abs(np.sqrt(np.mean(middle**2)) - 0.5 / math.sqrt(2)) < 0.01


def test_resample_removes_what_24khz_cannot_hold():
    out = resample(_tone(15000.0, 48000), 48000, 24000)  # above the new Nyquist (12 kHz)
    assert np.sqrt(np.mean(out[2000:-2000] ** 2)) < 0.01


@pytest.mark.parametrize("rate", [48000, 44100, 96000])
def test_a_resampler_fed_in_pieces_is_resample_bit_for_bit(rate):
    """StreamResampler (a Nano stream's pcm) fed uneven pieces gives resample's samples exactly,
    and both give the windowed sum gathered sample by sample: 48 and 96 kHz (integer
    decimations) read their windows as strided views, 44.1 kHz gathers them."""
    from moss_gguf_cli.tts.codec import StreamResampler, _kernel_table

    wav = _noise(1.3, rate, seed=3)
    whole = resample(wav, rate, 24000)
    stream, pieces, at = StreamResampler(rate, 24000), [], 0
    for size in [1, 7, 3840, 100, 12345, 2, 20000] * 4:
        pieces.append(stream.feed(wav[at : at + size]))
        at += size
    pieces += [stream.feed(wav[at:]), stream.end()]
    assert np.array_equal(np.concatenate(pieces), whole)
    g = math.gcd(rate, 24000)
    up, down = 24000 // g, rate // g
    table, half = _kernel_table(up, down)
    padded = np.concatenate([np.zeros(half, np.float32), wav, np.zeros(half + 1, np.float32)])
    n = np.arange(whole.size)
    base, taps = n * down // up, np.arange(-half + 1, half + 1)
    gathered = np.einsum("ij,ij->i", padded[base[:, None] + half + taps], table[n % up])
    assert np.array_equal(gathered.astype(np.float32), whole)


def test_loudness_normalize():
    quiet = _tone(440.0, 24000) * 0.1  # about -29 dBFS: the gain stops at +3 dB
    louder = loudness_normalize(quiet)
    np.testing.assert_allclose(louder[1:] / quiet[1:], 10 ** (3 / 20), rtol=1e-5)
    near = _tone(440.0, 24000) * 0.25  # about -21 dBFS: brought to -20 exactly
    rms_db = 10 * np.log10(np.mean(loudness_normalize(near).astype(np.float64) ** 2))
    assert abs(rms_db - (-20.0)) < 0.01
    assert loudness_normalize(np.zeros(0, np.float32)).size == 0


def test_loudness_level_is_measured_in_float32():
    """Upstream's backend measures the level in float32; so must we, bit for bit, or
    every sample of an unclamped gain moves by an ulp."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        wav = (rng.standard_normal(int(rng.integers(2000, 60000))) * 0.08).astype(np.float32)
        ms = np.float32(np.add.reduce(wav * wav, dtype=np.float32) / np.float32(wav.size))
        level = np.float32(20) * np.log10(np.sqrt(ms + np.float32(1e-9)))
        gain = min(max(float(np.float32(-20.0) - level), -3.0), 3.0)
        assert -3.0 < gain < 3.0  # the case that matters: not clamped
        want = wav * np.float32(10.0 ** (gain / 20.0))
        np.testing.assert_array_equal(loudness_normalize(wav), want)


def test_read_reference_mixes_resamples_and_normalises(tmp_path):
    stereo = np.stack([_tone(500.0, 16000, 1.0), _tone(500.0, 16000, 1.0)], axis=1) * 0.3
    path = tmp_path / "ref.flac"
    sf.write(path, stereo, 16000)
    wav = read_reference(path)
    assert wav.dtype == np.float32 and abs(wav.size - 24000) <= 1
    rms_db = 10 * np.log10(np.mean(wav.astype(np.float64) ** 2))
    assert -20.5 < rms_db < -19.5


def test_unreadable_reference(tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_text("this is not audio")
    with pytest.raises(InputError, match="cannot read the reference audio"):
        read_reference(bad)
    with pytest.raises(InputError, match="not found"):
        read_reference(tmp_path / "missing.wav")
