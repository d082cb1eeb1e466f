"""`layout`: the guide's weights tree, the synth YAML and the manifest, on real files."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.pipeline.layout import layout
from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec

runner = CliRunner()

YAML_KEYS = {
    "backbone_gguf",
    "embedding_dir",
    "lm_head_dir",
    "tokenizer_dir",
    "audio_backend",
    "audio_encoder_onnx",
    "audio_decoder_onnx",
    "heads_backend",
    "n_ctx",
    "n_batch",
    "n_threads",
    "n_gpu_layers",
    "max_new_tokens",
    "use_gpu_audio",
    "kv_cache_type_k",
    "kv_cache_type_v",
    "flash_attn",
    "text_temperature",
    "text_top_p",
    "text_top_k",
    "audio_temperature",
    "audio_top_p",
    "audio_top_k",
    "audio_repetition_penalty",
}


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_codec(tmp_path_factory.mktemp("codec") / "onnx")[0].parent


def test_tree_yaml_and_manifest(
    tiny_extracted: Path, tiny_f16_gguf: Path, codec: Path, tmp_path: Path
) -> None:
    out = tmp_path / "weights"
    result = runner.invoke(
        app,
        [
            "layout",
            "--extracted",
            str(tiny_extracted),
            "--gguf",
            str(tiny_f16_gguf),
            "--output",
            str(out),
            "--audio-tokenizer",
            str(codec),
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "backbone_f16.gguf",
            "embeddings",
            "lm_heads",
            "tokenizer",
            "audio_tokenizer",
            "extraction_meta.json",
            "README.md",
            "moss-tts.yaml",
            "manifest.json",
        ]
    )
    assert sorted(p.name for p in (out / "embeddings").iterdir()) == sorted(
        ["embed_tokens.npy"] + [f"emb_ext_{i:02d}.npy" for i in range(32)]
    )
    assert sorted(p.name for p in (out / "lm_heads").iterdir()) == sorted(
        ["lm_head_text.npy"] + [f"lm_head_audio_{i:02d}.npy" for i in range(32)]
    )
    assert {"tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (out / "tokenizer").iterdir()
    }
    assert {"encoder.onnx", "decoder.onnx"} <= {p.name for p in (out / "audio_tokenizer").iterdir()}

    config = yaml.safe_load((out / "moss-tts.yaml").read_text())
    assert set(config) == YAML_KEYS
    for key in (
        "backbone_gguf",
        "embedding_dir",
        "lm_head_dir",
        "tokenizer_dir",
        "audio_encoder_onnx",
        "audio_decoder_onnx",
    ):
        assert not Path(config[key]).is_absolute()
        assert (out / config[key]).exists(), key
    assert config["backbone_gguf"] == "backbone_f16.gguf"
    assert (config["audio_temperature"], config["audio_top_p"], config["audio_top_k"]) == (
        1.7,
        0.8,
        25,
    )

    manifest = json.loads((out / "manifest.json").read_text())
    listed = {f["path"]: f for f in manifest["files"]}
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert set(listed) == on_disk - {"manifest.json", "README.md"}  # the card: outside
    for rel, entry in listed.items():
        data = (out / rel).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), rel
    assert manifest["quant_types"] == {"backbone_f16.gguf": "MOSTLY_F16"}
    assert manifest["model"]["n_vq"] == 32 and manifest["tool"].startswith("moss-gguf ")


def test_link_copy_and_move(tiny_extracted: Path, tiny_f16_gguf: Path, tmp_path: Path) -> None:
    src_table = tiny_extracted / "embeddings/emb_ext_00.npy"
    linked = layout(tiny_extracted, tiny_f16_gguf, tmp_path / "l", mode="link")
    assert (tmp_path / "l/embeddings/emb_ext_00.npy").stat().st_ino == src_table.stat().st_ino
    assert linked.linked == len(linked.entries) - 1 and linked.copied == 0  # all but the YAML
    copied = layout(tiny_extracted, tiny_f16_gguf, tmp_path / "c", mode="copy")
    assert (tmp_path / "c/embeddings/emb_ext_00.npy").stat().st_ino != src_table.stat().st_ino
    assert copied.linked == 0
    movable = tmp_path / "movable"
    shutil.copytree(tiny_extracted, movable)
    gguf = tmp_path / "b.gguf"
    shutil.copyfile(tiny_f16_gguf, gguf)
    moved = layout(movable, gguf, tmp_path / "m", mode="move")
    assert moved.moved > 60 and not gguf.exists()
    assert not (movable / "embeddings/emb_ext_00.npy").exists()
    assert (tmp_path / "m/embeddings/emb_ext_00.npy").read_bytes() == src_table.read_bytes()


def test_missing_table_leaves_no_folder(
    tiny_extracted: Path, tiny_f16_gguf: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "extracted"
    shutil.copytree(tiny_extracted, broken)
    (broken / "lm_heads/lm_head_audio_17.npy").unlink()
    result = runner.invoke(
        app,
        [
            "layout",
            "--extracted",
            str(broken),
            "--gguf",
            str(tiny_f16_gguf),
            "--output",
            str(tmp_path / "w"),
        ],
    )
    assert result.exit_code == 2
    assert "lm_heads/lm_head_audio_17.npy is missing" in result.output
    assert not (tmp_path / "w").exists()
    assert not list(tmp_path.glob(".w.partial-*"))


def test_existing_output_is_refused(
    tiny_extracted: Path, tiny_f16_gguf: Path, tmp_path: Path
) -> None:
    out = tmp_path / "w"
    out.mkdir()
    (out / "x").write_text("mine")
    result = runner.invoke(
        app,
        [
            "layout",
            "--extracted",
            str(tiny_extracted),
            "--gguf",
            str(tiny_f16_gguf),
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 1 and "--force" in result.output
    assert (out / "x").read_text() == "mine"


def test_not_an_extract_folder(tiny_f16_gguf: Path, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "layout",
            "--extracted",
            str(tmp_path),
            "--gguf",
            str(tiny_f16_gguf),
            "--output",
            str(tmp_path / "w"),
        ],
    )
    assert result.exit_code == 2 and "extraction_meta.json not found" in result.output
