"""The MOSS delay family converts, each with its own sizes; look-alikes are refused cleanly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import yaml

from moss_gguf_cli.errors import UnsupportedModelError
from moss_gguf_cli.source.checkpoint import MossConfig, open_checkpoint
from moss_gguf_cli.source.tiny import ensure_tiny


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "160"},
    )


def gguf_tensor_names(path: Path) -> set[str]:
    return {t.name for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """`all` once per supported builtin variant."""
    root = tmp_path_factory.mktemp("family")
    runs = {}
    for variant in ("tiny-ttsd", "tiny-voicegen", "tiny-soundeffect"):
        out = root / variant
        runs[variant] = (out, cli("all", "--model", f"builtin:{variant}", "--output", str(out)))
    return runs


def test_ttsd_has_16_codebooks_everywhere(built) -> None:
    out, proc = built["tiny-ttsd"]
    assert proc.returncode == 0, proc.stderr
    assert len(list((out / "embeddings").glob("emb_ext_*.npy"))) == 16
    assert len(list((out / "lm_heads").glob("lm_head_audio_*.npy"))) == 16
    meta = json.loads((out / "extraction_meta.json").read_text())
    assert meta["n_vq"] == 16
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["n_vq"] == 16


def test_voicegen_keeps_its_own_text_head_and_falls_back_to_bf16(built) -> None:
    out, proc = built["tiny-voicegen"]
    assert proc.returncode == 0, proc.stderr
    # its language_config says tied, but lm_heads.0 is a separate tensor: keep `output`
    assert "output.weight" in gguf_tensor_names(out / "backbone_q4_k_m.gguf")
    assert "f16 would overflow" in proc.stderr and "bf16" in proc.stderr
    assert "language_model.layers.1.mlp.down_proj.weight" in proc.stderr
    head = np.load(out / "lm_heads/lm_head_text.npy", mmap_mode="r")
    src = open_checkpoint(ensure_tiny("tiny-voicegen")).tensors["lm_heads.0.weight"]
    assert np.array_equal(head[:4], src.read_f32(0, 4).astype(np.float16))


def test_voicegen_backbone_config_is_untied(tmp_path: Path) -> None:
    proc = cli("extract", "--model", "builtin:tiny-voicegen", "--output", str(tmp_path / "x"), "-q")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "x/qwen3_backbone/config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert (tmp_path / "x/qwen3_backbone/model.safetensors").is_file()  # one shard, as the source


def test_soundeffect_converts(built) -> None:
    out, proc = built["tiny-soundeffect"]
    assert proc.returncode == 0, proc.stderr
    assert (out / "backbone_q4_k_m.gguf").is_file()


def test_key_variants_of_ports_are_accepted() -> None:
    base = json.loads((ensure_tiny("tiny") / "config.json").read_text())
    for key in ("n_vq", "audio_vocab_size", "audio_pad_code"):
        base.pop(key)
    base.update(n_codebooks=16, codebook_size=2048, codebook_pad_token_id=2048)
    moss = MossConfig.from_dict(base)
    assert (moss.n_vq, moss.audio_vocab_size, moss.audio_pad_code, moss.audio_rows) == (
        16,
        2048,
        2048,
        2049,
    )


def _lookalike(tmp_path: Path, edit) -> Path:
    model = tmp_path / "model"
    shutil.copytree(ensure_tiny("tiny"), model)
    config = json.loads((model / "config.json").read_text())
    edit(model, config)
    (model / "config.json").write_text(json.dumps(config))
    return model


def _diffusion(model: Path, config: dict) -> None:
    (model / "model_index.json").write_text('{"_class_name": "MossSoundEffectPipeline"}')


LOOKALIKES = {
    "local transformer": (
        lambda m, c: c.update(local_num_layers=4, local_hidden_size=1536),
        "MOSS-TTS-Local-Transformer",
    ),
    "local v1.5": (lambda m, c: c.update(model_type="moss_tts_local"), "MOSS-TTS-Local"),
    "realtime": (lambda m, c: c.update(model_type="moss_tts_realtime"), "MOSS-TTS-Realtime"),
    "ttsd v0.5": (
        lambda m, c: (
            c.pop("language_config"),
            c.update(model_type="asteroid", architectures=["AsteroidTTSInstruct"]),
        ),
        "MOSS-TTSD v0.5/v0.7",
    ),
    "ttsd v0.7": (lambda m, c: c.update(model_type="moss_ttsd"), "MOSS-TTSD v0.5/v0.7"),
    "nano": (lambda m, c: c.update(model_type="moss_tts_nano"), "MOSS-TTS-Nano"),
    "soundeffect v2 diffusion": (_diffusion, "diffusion pipeline"),
}


@pytest.mark.parametrize("case", list(LOOKALIKES))
@pytest.mark.parametrize("command", ["all", "extract"])
def test_lookalikes_are_refused(case: str, command: str, tmp_path: Path) -> None:
    edit, reason = LOOKALIKES[case]
    model = _lookalike(tmp_path, edit)
    out = tmp_path / "out"
    proc = cli(command, "--model", str(model), "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing written


def test_builtin_local_lookalike_is_refused_by_every_converter(tmp_path: Path) -> None:
    for args in (
        ["all", "--model", "builtin:tiny-local", "--output", str(tmp_path / "a")],
        ["convert", str(ensure_tiny("tiny-local")), "--outfile", str(tmp_path / "b.gguf")],
    ):
        proc = cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert "Local" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UnsupportedModelError):
        open_checkpoint(ensure_tiny("tiny-local"))


def test_synth_config_points_at_real_files(built) -> None:
    for variant, (out, proc) in built.items():
        assert proc.returncode == 0, (variant, proc.stderr)
        config = yaml.safe_load((out / "moss-tts.yaml").read_text())
        for key in ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir"):
            assert (out / config[key]).exists(), (variant, key)


@pytest.mark.parametrize("variant", ["tiny-voicegen", "tiny-soundeffect"])
def test_synth_speaks_with_single_speaker_variants(variant: str, built, tmp_path: Path) -> None:
    import soundfile as sf

    out, _ = built[variant]
    wav = tmp_path / "x.wav"
    proc = cli(
        "synth",
        "--config",
        str(out / "moss-tts.yaml"),
        "--text",
        "Hello there",
        "--output",
        str(wav),
        "--max-new-tokens",
        "60",
        "--threads",
        "1",
        "--seed",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(wav)
    assert rate == 24000 and len(audio) % 1920 == 0


def test_synth_refuses_ttsd_clearly(built, tmp_path: Path) -> None:
    out, _ = built["tiny-ttsd"]
    proc = cli(
        "synth",
        "--config",
        str(out / "moss-tts.yaml"),
        "--text",
        "Hello",
        "--output",
        str(tmp_path / "x.wav"),
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "TTSD" in lines[0]
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize("variant", ["tiny-ttsd", "tiny-voicegen", "tiny-soundeffect"])
def test_verify_against_the_source(variant: str, built) -> None:
    out, _ = built[variant]
    proc = cli("verify", str(out), "--source", f"builtin:{variant}", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    statuses = {row["status"] for row in report["rows"]}
    assert "fail" not in statuses
