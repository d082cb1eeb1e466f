"""`synth` end to end on builtin:tiny: config, Synthesizer API, CLI and bad input."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import TINY_SYNTH_YAML as BASE
from conftest import write_yaml
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.delay import SynthConfig, Synthesizer, synth_to_wav
from moss_gguf_cli.delay.config import ModelInfo, find_model_info
from moss_gguf_cli.errors import InputError, UsageError
from moss_gguf_cli.tts.codec import FRAME_SAMPLES

STEPS = BASE["max_new_tokens"]


@pytest.fixture(scope="module")
def weights(tiny_weights: Path) -> Path:
    return tiny_weights


@pytest.fixture(scope="module")
def config(weights: Path) -> SynthConfig:
    return SynthConfig.from_yaml(weights / "moss-tts.yaml")


@pytest.fixture(scope="module")
def tts(config: SynthConfig):
    with Synthesizer(config) as synthesizer:
        yield synthesizer


# ---------------------------------------------------------------- config


def test_yaml_paths_resolve_against_its_folder(weights, config, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # nowhere near the weights
    loaded = SynthConfig.from_yaml(weights / "moss-tts.yaml")
    assert loaded.backbone_gguf == (weights / "backbone_f16.gguf").resolve()
    assert loaded.audio_decoder_onnx == (weights / "audio_tokenizer/decoder.onnx").resolve()
    assert loaded.flash_attn == "disabled" and loaded.n_threads == 1
    loaded.check_files(need_encoder=True)
    assert config.text_temperature == 1.5 and config.audio_top_k == 25  # the documented defaults


def test_unknown_keys_warn_and_wrong_types_name_the_key(weights, tmp_path, caplog):
    path = write_yaml(tmp_path / "c.yaml", **{**BASE, "backbone_gguf": "x.gguf", "colour": 3})
    with caplog.at_level(logging.WARNING, logger="moss_gguf_cli"):
        SynthConfig.from_yaml(path)
    assert "unknown key 'colour'" in caplog.text
    for key, value in [("n_ctx", "big"), ("audio_top_p", "0.8"), ("use_gpu_audio", "yes")]:
        path = write_yaml(tmp_path / "c.yaml", **{**BASE, key: value})
        with pytest.raises(UsageError, match=f"config key {key} must be"):
            SynthConfig.from_yaml(path)
    path = write_yaml(tmp_path / "c.yaml", **{k: v for k, v in BASE.items() if k != "lm_head_dir"})
    with pytest.raises(UsageError, match="missing lm_head_dir"):
        SynthConfig.from_yaml(path)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InputError, match="not a mapping"):
        SynthConfig.from_yaml(tmp_path / "list.yaml")


def test_flags_override_the_yaml(config):
    changed = config.override(audio_top_k=5, n_threads=1, text_temperature=0.0, seed=None)
    assert (changed.audio_top_k, changed.n_threads, changed.text_temperature) == (5, 1, 0.0)
    assert changed.audio_top_p == config.audio_top_p
    with pytest.raises(UsageError, match="audio_top_p"):
        config.override(audio_top_p=0.0)
    with pytest.raises(UsageError, match="n_ctx"):
        config.override(n_ctx="many")


def test_upstream_yaml_is_understood(weights, tmp_path, monkeypatch):
    upstream = """
# ── Model paths (relative to the project root) ──
backbone_gguf: weights/backbone_f16.gguf
embedding_dir: weights/embeddings
lm_head_dir: weights/lm_heads
tokenizer_dir: weights/tokenizer
audio_backend: onnx
audio_encoder_onnx: weights/audio_tokenizer/encoder.onnx
audio_decoder_onnx: weights/audio_tokenizer/decoder.onnx
heads_backend: auto
n_ctx: 4096
n_batch: 512
n_threads: 4
n_gpu_layers: -1
max_new_tokens: 3072
use_gpu_audio: true
# kv_cache_type_k: f16
# flash_attn: auto
text_temperature: 1.5
text_top_p: 1.0
text_top_k: 50
audio_temperature: 1.7
audio_top_p: 0.8
audio_top_k: 25
audio_repetition_penalty: 1.0
"""
    project = tmp_path / "project"
    (project / "configs" / "llama_cpp").mkdir(parents=True)
    (project / "weights").symlink_to(weights)
    path = project / "configs" / "llama_cpp" / "default.yaml"
    path.write_text(upstream)
    monkeypatch.chdir(project)
    loaded = SynthConfig.from_yaml(path)
    loaded.check_files(need_encoder=True)
    assert loaded.use_gpu_audio and loaded.flash_attn == "auto" and loaded.n_ctx == 4096
    assert loaded.max_new_tokens == 3072
    info = find_model_info(loaded)  # found beside the tables' folder
    assert info.n_vq == 32 and info.source.name == "extraction_meta.json"


def test_model_facts_come_from_the_meta(weights, config, tmp_path):
    info = find_model_info(config)
    assert info.n_vq == 32 and info.audio_pad_code == 1024 and info.variant == "MOSS-TTS"
    assert (
        info.im_end_token_id == 151645 and info.source == weights.resolve() / "extraction_meta.json"
    )
    # no meta anywhere: the documented defaults, n_vq from the tables present
    bare = tmp_path / "bare"
    (bare / "embeddings").mkdir(parents=True)
    for k in range(3):
        (bare / "embeddings" / f"emb_ext_{k:02d}.npy").write_bytes(b"")
    cfg = SynthConfig(
        backbone_gguf=bare / "b.gguf",
        embedding_dir=bare / "embeddings",
        lm_head_dir=bare,
        tokenizer_dir=bare,
        source=bare / "x.yaml",
    )
    assert find_model_info(cfg) == ModelInfo(n_vq=3)


# ---------------------------------------------------------------- end to end


def test_seeded_runs_are_deterministic(tts):
    first = tts.synthesize("Hello world.", seed=11)
    again = tts.synthesize("Hello world.", seed=11)
    other = tts.synthesize("Hello world.", seed=12)
    np.testing.assert_array_equal(first.waveform, again.waveform)
    np.testing.assert_array_equal(first.rows, again.rows)
    assert not np.array_equal(first.rows, other.rows)
    p = first.profile
    assert p.steps == STEPS and not p.stopped  # ran to max_new_tokens
    assert p.frames >= 1 and first.waveform.size == p.frames * FRAME_SAMPLES
    assert first.waveform.dtype == np.float32 and np.all(np.isfinite(first.waveform))
    assert sum(c.shape[0] for c in first.codes) == p.frames
    assert p.prefill_tokens_per_s > 0 and p.steps_per_s > 0 and p.real_time_factor > 0
    assert p.heads_backend in ("ggml", "numpy")
    # the first generated row: forced gen-slot (step 0 inside audio), codebook 0 only
    assert first.rows[0, 0] == 151656
    assert (first.rows[0, 2:] == 1024).all() and first.rows[0, 1] != 1024


def test_greedy_runs_are_deterministic(config):
    greedy = config.override(text_temperature=0.0, audio_temperature=0.0, max_new_tokens=40)
    with Synthesizer(greedy) as tts:
        a = tts.synthesize("Greedy, please.")
        b = tts.synthesize("Greedy, please.", seed=999)  # the seed does not matter
    np.testing.assert_array_equal(a.rows, b.rows)
    np.testing.assert_array_equal(a.waveform, b.waveform)
    assert a.waveform.size == a.profile.frames * FRAME_SAMPLES


def test_numpy_heads_slices_are_bitwise_the_full_product(config):
    """Upstream's backend multiplies the hidden state by the whole stacked head every
    step; any codebook range we ask for must hold exactly those bits (greedy ties)."""
    from moss_gguf_cli.delay.heads import AudioHeads, load_stacked

    stacked = load_stacked(config.lm_head_dir, 32, 1025, np.float32)
    heads = AudioHeads(config.lm_head_dir, 32, 1025, 1024, backend="numpy")
    rng = np.random.default_rng(3)
    for _ in range(20):
        hidden = rng.standard_normal(256).astype(np.float32)
        full = (hidden[np.newaxis, :] @ stacked.T).reshape(32, 1025)
        full[:, 1024] = -np.inf
        for start, stop in [(0, 32), (0, 1), (0, 7), (1, 32), (5, 17), (30, 32), (31, 32)]:
            np.testing.assert_array_equal(heads.logits(hidden, start, stop), full[start:stop])


def test_numpy_and_ggml_heads_agree(config):
    from moss_gguf_cli.delay.heads import AudioHeads

    hidden = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    out = {}
    for backend in ("numpy", "ggml"):
        heads = AudioHeads(config.lm_head_dir, 32, 1025, 1024, backend=backend, n_threads=1)
        out[heads.backend] = heads.logits(hidden).copy()
        part = heads.logits(hidden, 3, 7)
        assert part.shape == (4, 1025)
        np.testing.assert_allclose(part, out[heads.backend][3:7], rtol=1e-5, atol=1e-6)
        heads.close()
    assert set(out) == {"numpy", "ggml"}
    assert np.isneginf(out["numpy"][:, 1024]).all() and np.isneginf(out["ggml"][:, 1024]).all()
    finite = out["numpy"][:, :1024]
    np.testing.assert_allclose(out["ggml"][:, :1024], finite, atol=1e-3 * np.abs(finite).max())
    # the numpy path is the exact product of the stored float16 tables
    table = np.load(config.lm_head_dir / "lm_head_audio_05.npy").astype(np.float32)
    np.testing.assert_allclose(out["numpy"][5, :1024], table[:1024] @ hidden, rtol=1e-5, atol=1e-5)


def test_reference_voice(tts, reference_wav):
    result = tts.synthesize("Clone this voice.", reference=reference_wav, seed=5)
    expected_frames = math.ceil(round(0.9 * 24000) / FRAME_SAMPLES)
    assert result.profile.reference_frames == expected_frames
    assert result.waveform.size == result.profile.frames * FRAME_SAMPLES
    again = tts.synthesize("Clone this voice.", reference=reference_wav, seed=5)
    np.testing.assert_array_equal(result.waveform, again.waveform)
    plain = tts.synthesize("Clone this voice.", seed=5)
    # "None" (1 token) becomes "[S1]:\n" (3) + audio-start + T + 31 slots + audio-end
    assert result.profile.prompt_rows == plain.profile.prompt_rows - 1 + 3 + expected_frames + 33


def test_one_call_may_change_the_sampling(tts, config):
    greedy = {"text_temperature": 0, "audio_temperature": 0.0}
    one = tts.synthesize("Hi", seed=1, max_new_tokens=36, sampling=greedy)
    two = tts.synthesize("Hi", seed=2, max_new_tokens=36, sampling=greedy)
    np.testing.assert_array_equal(one.rows, two.rows)  # greedy: the seed plays no part
    sampled = tts.synthesize("Hi", seed=2, max_new_tokens=36)
    assert not np.array_equal(sampled.rows, two.rows)  # the config's sampling again
    assert tts.config == config
    with pytest.raises(UsageError, match="not a sampling setting: n_ctx"):
        tts.synthesize("Hi", sampling={"n_ctx": 128})
    with pytest.raises(UsageError, match="audio_top_p"):
        tts.synthesize("Hi", sampling={"audio_top_p": 0.0})


def test_generate_returns_the_waveform(tts):
    wav = tts.generate("Short.", seed=1, max_new_tokens=36)
    assert wav.ndim == 1 and wav.size == tts.last_profile.frames * FRAME_SAMPLES


def test_synth_to_wav_writes_frames_times_1920(config, tmp_path):
    out = tmp_path / "hello.wav"
    result = synth_to_wav(config, out, "Hello", seed=3)
    data, rate = sf.read(out)
    assert rate == 24000 and data.ndim == 1
    assert data.shape[0] == result.profile.frames * FRAME_SAMPLES
    assert not list(tmp_path.glob(".*tmp"))


# ---------------------------------------------------------------- CLI


def _synth(weights: Path, *args: str, input: str | None = None):
    argv = ["synth", "--config", str(weights / "moss-tts.yaml"), *args]
    return CliRunner().invoke(app, argv, input=input)


def test_cli_writes_a_wav_and_profiles(weights, tmp_path):
    out = tmp_path / "demo.wav"
    result = _synth(weights, "--text", "Hello", "-o", str(out), "--seed", "4", "--profile")
    assert result.exit_code == 0, result.output
    assert "real-time factor" in result.output and "steps/s" in result.output
    assert "floor / step" in result.output and "floor / actual" in result.output
    data, rate = sf.read(out)
    assert rate == 24000 and data.size % FRAME_SAMPLES == 0 and data.size > 0
    # the same seed through the API gives the same samples
    again = tmp_path / "again.wav"
    result = _synth(weights, "--text", "Hello", "-o", str(again), "--seed", "4", "-q")
    assert result.exit_code == 0 and out.read_bytes() == again.read_bytes()


def test_cli_text_from_stdin_and_file(weights, tmp_path):
    from_stdin = tmp_path / "stdin.wav"
    result = _synth(weights, "--text", "-", "-o", str(from_stdin), "--seed", "2", "-q", input="Hi")
    assert result.exit_code == 0, result.output
    (tmp_path / "t.txt").write_text("Hi", encoding="utf-8")
    from_file = tmp_path / "file.wav"
    result = _synth(weights, "--text-file", str(tmp_path / "t.txt"), "-o", str(from_file),
                    "--seed", "2", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert from_stdin.read_bytes() == from_file.read_bytes()


def test_cli_flags_reach_the_sampler(weights, tmp_path):
    args = ["--text", "Hi", "--seed", "1", "--max-new-tokens", "36", "-q"]
    greedy = ["--text-temperature", "0", "--audio-temperature", "0"]
    out1, out2 = tmp_path / "1.wav", tmp_path / "2.wav"
    assert _synth(weights, *args, *greedy, "-o", str(out1)).exit_code == 0
    assert _synth(weights, *args, *greedy, "--seed", "77", "-o", str(out2)).exit_code == 0
    assert out1.read_bytes() == out2.read_bytes()  # greedy: the seed plays no part


# ---------------------------------------------------------------- bad input


def test_empty_text(weights, tmp_path):
    result = _synth(weights, "--text", "  ", "-o", str(tmp_path / "x.wav"))
    assert result.exit_code == 2 and "empty" in result.output
    result = _synth(weights, "-o", str(tmp_path / "x.wav"))
    assert result.exit_code == 2 and "exactly one of --text and --text-file" in result.output


def test_config_pointing_at_missing_files(weights, tmp_path):
    path = write_yaml(tmp_path / "c.yaml", **{**BASE, "backbone_gguf": str(weights / "no.gguf")})
    result = CliRunner().invoke(
        app, ["synth", "-c", str(path), "--text", "Hi", "-o", str(tmp_path / "x.wav")]
    )
    assert result.exit_code == 2
    assert "backbone_gguf points at a missing file" in result.output
    result = CliRunner().invoke(
        app, ["synth", "-c", str(tmp_path / "nope.yaml"), "--text", "Hi", "-o", "x.wav"]
    )
    assert result.exit_code == 2 and "config file not found" in result.output


def test_prompt_longer_than_n_ctx(weights, tmp_path):
    path = weights / "short-ctx.yaml"
    write_yaml(path, **{**BASE, "n_ctx": 64})
    text = "This sentence is far too long for a context of sixty-four positions. " * 3
    result = CliRunner().invoke(
        app, ["synth", "-c", str(path), "--text", text, "-o", str(tmp_path / "x.wav")]
    )
    assert result.exit_code == 2 and "n_ctx is 64" in result.output
    assert not (tmp_path / "x.wav").exists()


def test_unreadable_reference(weights, tmp_path):
    bad = tmp_path / "voice.wav"
    bad.write_text("not audio at all")
    result = _synth(weights, "--text", "Hi", "--reference", str(bad), "-o", str(tmp_path / "x.wav"))
    assert result.exit_code == 2 and "cannot read the reference audio" in result.output
    missing = _synth(weights, "--text", "Hi", "--reference", "nope.wav", "-o", "x.wav")
    assert missing.exit_code == 2 and "reference audio not found" in missing.output


def test_decoder_with_the_wrong_signature(weights, tmp_path):
    path = weights / "bad-decoder.yaml"
    write_yaml(path, **{**BASE, "audio_decoder_onnx": "audio_tokenizer/encoder.onnx"})
    result = CliRunner().invoke(
        app, ["synth", "-c", str(path), "--text", "Hi", "-o", str(tmp_path / "x.wav")]
    )
    assert result.exit_code == 2 and "wrong signature" in result.output


def test_ggml_heads_survive_thousands_of_steps():
    """ggml takes a work buffer from the context it computes in, on every call: a long run
    must not run that context dry (it aborted after ~190 steps at the real hidden size)."""
    code = (
        "import numpy as np\n"
        "from moss_gguf_cli.delay.heads import _GgmlMatVec\n"
        "m = _GgmlMatVec(64, 4096, 2)\n"
        "m.weights[:] = np.ones((64, 4096), np.float16)\n"
        "x = np.full(4096, 0.5, np.float32)\n"
        "for _ in range(3000):\n"
        "    y = m(x)\n"
        "assert np.allclose(y, 2048.0), y[:4]\n"
        "m.close()\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
