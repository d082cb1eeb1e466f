"""`verify` on real files: a good weights folder made by the real chain (extract → convert →
quantize → layout) passes every check, also with --source and --deep; each corruption fails
with the right row named; the CLI's exit codes and --json.

Each corruption works on a copy of the good folder made of hard links (fast), and a file is
copied for real before it is changed (`_own`), so the shared folder stays intact.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from unittest import mock

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.errors import InputError, UsageError
from moss_gguf_cli.pipeline.convert import convert
from moss_gguf_cli.pipeline.layout import layout
from moss_gguf_cli.progress import RecordingProgress
from moss_gguf_cli.quantize.llama import quantize
from moss_gguf_cli.source import tiny
from moss_gguf_cli.source.hub import NO_RECORD
from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec
from moss_gguf_cli.verify import (
    SCALE_OFFSETS,
    VerifyReport,
    bpw_range,
    file_type_base,
    finite_blocks,
    read_gguf,
    tensor_threshold,
    verify,
)

runner = CliRunner()
GGUF_NAME = "backbone_q4_k_m.gguf"

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def chain(tiny_extracted: Path, tiny_f16_gguf: Path, tmp_path_factory) -> dict[str, Path]:
    """The real chain on builtin:tiny: f16 GGUF (the run's shared one), its Q4_K_M, and the
    laid-out weights folder."""
    root = tmp_path_factory.mktemp("verify-chain")
    f16 = tiny_f16_gguf
    q4 = root / GGUF_NAME
    quantize(f16, q4, ["Q4_K_M"], engine="library")
    weights = root / "weights"
    codec = ensure_tiny_codec(root / "codec")[0].parent
    layout(tiny_extracted, q4, weights, audio_tokenizer=codec)
    return {"f16": f16, "q4": q4, "weights": weights}


@pytest.fixture(scope="session")
def good(chain: dict[str, Path]) -> Path:
    return chain["weights"]


@pytest.fixture(scope="session")
def other_gguf(tmp_path_factory) -> Path:
    """A Q4_K_M GGUF of another model: builtin:tiny's dims and names, another random seed."""
    root = tmp_path_factory.mktemp("other-model")
    model = root / "model"
    model.mkdir()
    seeded = np.random.default_rng
    with mock.patch.object(tiny.np.random, "default_rng", lambda seed: seeded(seed + 1)):
        tiny.write_tiny(model, tiny.TinySpec())
    convert(model, root / "f16.gguf", outtype="f16")
    quantize(root / "f16.gguf", root / GGUF_NAME, ["Q4_K_M"], engine="library")
    return root / GGUF_NAME


def _clone(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, copy_function=os.link)
    return dest


def _own(path: Path) -> Path:
    """Give a hard-linked file its own copy before it is changed."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    return path


def _failing(report: VerifyReport) -> dict[str, str]:
    return {r.name: r.detail for r in report.rows if r.status == "fail"}


def _kv_value_offset(path: Path, key: str) -> int:
    """Byte offset of a scalar key's value in a GGUF header (after its name and type)."""
    with open(path, "rb") as f:
        data = f.read(32 << 20)  # the header, token lists included
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name)
    return at + 8 + len(name) + 4


ALWAYS = {
    "model facts",
    "synth config",
    "audio tokenizer",
    "audio tokenizer download",
    "backbone GGUF",
    "embedding tables",
    "head tables",
    "tokenizer files",
    "table format",
    "table shapes",
    "table sizes",
    "table values",
    "manifest",
    "GGUF header",
    "GGUF size",
    "GGUF architecture",
    "GGUF hyperparameters",
    "GGUF tensors",
    "GGUF file type",
    "GGUF bits per weight",
    "GGUF tokenizer",
    "GGUF values",
    "tokenizer loads",
    "special tokens",
    "tokenizer round trip",
    "hidden size",
    "text head vs GGUF output",
    "text embedding vs GGUF token_embd",
}


# ----------------------------------------------------------------------------- good inputs


def test_good_weights_folder_passes_every_check(good: Path) -> None:
    progress = RecordingProgress()
    report = verify(good, progress=progress)
    assert report.ok and report.kind == "weights"
    assert {r.name for r in report.rows} == ALWAYS
    # the codec came from a plain local folder: nothing to check its hashes against, and
    # verify says so as a warning (the only one)
    (unchecked,) = [r for r in report.rows if r.status != "pass"]
    assert unchecked.name == "audio tokenizer download" and unchecked.status == "warn"
    assert unchecked.detail == NO_RECORD
    assert report.model["n_vq"] == 32 and report.model["hidden_size"] == 256
    assert "Q4_K_M" in report.row("GGUF file type").detail
    # every byte of the folder went through the one streaming pass
    assert progress.done["verify:read"] == progress.totals["verify:read"] > 0


def test_good_folder_passes_with_source_and_deep(good: Path) -> None:
    report = verify(good, source="builtin:tiny", deep=True)
    assert report.ok, _failing(report)
    extra = {
        "source config",
        "tables vs source",
        "GGUF vs source",
        "deep: hidden state",
        "deep: audio logits",
    }
    assert {r.name for r in report.rows} == ALWAYS | extra
    assert all(report.row(n).status == "pass" for n in extra)
    q = report.quality
    assert len(q.tensors) == 25 and set(q.by_type) == {"F32", "Q4_K", "Q6_K"}
    assert q.by_type["F32"]["max_rel_rmse"] == 0.0  # norms are copied exactly
    assert 0 < q.by_type["Q4_K"]["max_rel_rmse"] < tensor_threshold("Q4_K")[0]
    (deep,) = report.deep
    assert deep.file_type == "MOSTLY_Q4_K_M" and deep.rows > 10
    assert deep.hidden_cosine_min >= deep.thresholds[0]
    assert deep.top1_agreement >= deep.thresholds[2]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is True and len(data["quality"]["tensors"]) == 25
    assert data["deep"][0]["gguf"] == GGUF_NAME


def test_deep_finds_the_source_recorded_in_the_meta(good: Path) -> None:
    # extract recorded source_model = builtin:tiny, which resolves without --source
    report = verify(good, deep=True)
    assert report.ok, _failing(report)
    assert report.row("deep: audio logits").status == "pass"


def test_extract_folder(tiny_extracted: Path) -> None:
    report = verify(tiny_extracted, source="builtin:tiny")
    assert report.ok and report.kind == "extract", _failing(report)
    assert report.row("backbone weights").status == "pass"
    assert report.row("backbone vs source").status == "pass"
    assert report.row("tables vs source").status == "pass"
    assert not any(r.name.startswith("GGUF") for r in report.rows)


def test_extract_folder_without_backbone_weights(tiny_extracted: Path, tmp_path: Path) -> None:
    # `all` extracts only the backbone's config and tokenizer
    e = _clone(tiny_extracted, tmp_path / "e")
    for f in (e / "qwen3_backbone").glob("model*.safetensors*"):
        f.unlink()
    report = verify(e)
    assert report.ok
    assert report.row("backbone weights").status == "warn"


def test_folder_with_two_ggufs(good: Path, chain: dict[str, Path], tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    os.link(chain["f16"], w / "backbone_f16.gguf")
    (w / "manifest.json").unlink()
    report = verify(w, source="builtin:tiny")
    assert report.ok, _failing(report)
    for gguf_name, ftype in (("backbone_f16.gguf", "F16"), (GGUF_NAME, "Q4_K_M")):
        assert ftype in report.row(f"GGUF file type ({gguf_name})").detail
        assert report.row(f"GGUF vs source ({gguf_name})").status == "pass"
    assert {q.gguf for q in report.quality.tensors} == {"backbone_f16.gguf", GGUF_NAME}


def test_single_gguf(chain: dict[str, Path]) -> None:
    report = verify(chain["f16"])
    assert report.ok and report.kind == "gguf", _failing(report)
    assert report.row("GGUF hyperparameters").status == "pass"
    assert "no model config" in report.row("GGUF hyperparameters").detail
    report = verify(chain["f16"], source="builtin:tiny")
    assert report.ok, _failing(report)
    by_type = report.quality.by_type
    assert set(by_type) == {"F16", "F32"}
    # bf16 → f16 is exact but for the few values below f16's normal range
    assert by_type["F16"]["max_rel_rmse"] < 1e-6 and by_type["F32"]["max_rel_rmse"] == 0.0


def test_yaml_target_resolves_paths_against_its_folder(good: Path, tmp_path: Path, monkeypatch):
    weights = _clone(good, tmp_path / "w")
    cfg = tmp_path / "configs" / "mine.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        f"backbone_gguf: ../w/{GGUF_NAME}\nembedding_dir: ../w/embeddings\n"
        "lm_head_dir: ../w/lm_heads\ntokenizer_dir: ../w/tokenizer\n"
        "model_config: ../w/extraction_meta.json\nn_ctx: 4096\n"
        "audio_encoder_onnx: ../w/audio_tokenizer/encoder.onnx\n"
        "audio_decoder_onnx: ../w/audio_tokenizer/decoder.onnx\n"
    )
    monkeypatch.chdir(tmp_path / "configs")
    assert verify(Path("mine.yaml")).ok
    monkeypatch.chdir(weights / "embeddings")  # elsewhere: still relative to the YAML
    report = verify(cfg)
    assert report.ok and report.kind == "config", _failing(report)
    # the YAML layout wrote, inside the folder, also passes
    assert verify(weights / "moss-tts.yaml").ok

    cfg.write_text(cfg.read_text().replace(GGUF_NAME, "nope.gguf"))
    failing = _failing(verify(cfg))
    assert "backbone_gguf points at a missing ../w/nope.gguf" in failing["synth config"]
    assert "nope.gguf is missing" in failing["GGUF header"]


# ----------------------------------------------------------------------------- corruptions


def test_missing_npy(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    (w / "embeddings" / "emb_ext_05.npy").unlink()
    failing = _failing(verify(w))
    assert set(failing) == {"embedding tables", "manifest"}
    assert "embeddings/emb_ext_05.npy is missing" in failing["embedding tables"]
    assert "embeddings/emb_ext_05.npy is missing" in failing["manifest"]


def test_wrong_shape_npy(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = w / "lm_heads" / "lm_head_audio_03.npy"
    path.unlink()
    np.save(path, np.zeros((1024, 256), dtype=np.float16))
    failing = _failing(verify(w))
    assert set(failing) == {"table shapes", "manifest"}
    assert (
        "lm_heads/lm_head_audio_03.npy: shape [1024, 256], expected [1025, 256]"
        in (failing["table shapes"])
    )


def test_npy_with_inf(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = _own(w / "embeddings" / "emb_ext_07.npy")
    table = np.lib.format.open_memmap(path, mode="r+")
    table[100, 5] = np.inf
    table.flush()
    del table
    failing = _failing(verify(w))
    assert set(failing) == {"table values", "manifest"}
    assert (
        "embeddings/emb_ext_07.npy: 1 Inf/NaN values (float16 overflow?), first in row 100"
        in (failing["table values"])
    )


def test_float32_table_beyond_float16_range_is_a_warning(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = w / "embeddings" / "emb_ext_08.npy"
    table = np.load(path).astype(np.float32)
    table[3, 3] = 1e5
    path.unlink()
    np.save(path, table)
    (w / "manifest.json").unlink()
    report = verify(w)
    assert report.ok
    row = report.row("table values")
    assert row.status == "warn" and "emb_ext_08.npy: 1 values beyond ±65504" in row.detail
    assert "float16/float32" in report.row("table format").detail


def test_truncated_gguf(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = _own(w / GGUF_NAME)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1024)
    report = verify(w)
    failing = _failing(report)
    assert "truncated" in failing["GGUF size"] and "(1024 missing)" in failing["GGUF size"]
    assert "were not read" in failing["GGUF values"]
    assert report.row("GGUF tensors").status == "pass"  # the header is intact
    # the numeric comparison skips what is not there instead of crashing
    failing = _failing(verify(w, source="builtin:tiny"))
    assert "data past the end of the file" in failing["GGUF vs source"]


def test_changed_hyperparameter(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = _own(w / GGUF_NAME)
    at = _kv_value_offset(path, "qwen3.context_length")
    with open(path, "r+b") as f:
        f.seek(at)
        assert struct.unpack("<I", f.read(4))[0] == 40960
        f.seek(at)
        f.write(struct.pack("<I", 8192))
    assert read_gguf(path).kv["qwen3.context_length"] == 8192
    failing = _failing(verify(w))
    assert set(failing) == {"GGUF hyperparameters", "manifest"}
    assert "qwen3.context_length = 8192, config says 40960" in failing["GGUF hyperparameters"]


def test_wrong_file_type_label(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = _own(w / GGUF_NAME)
    at = _kv_value_offset(path, "general.file_type")
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<I", int(gguf.LlamaFileType.MOSTLY_Q8_0)))
    failing = _failing(verify(w))
    assert set(failing) == {"GGUF file type", "GGUF bits per weight", "manifest"}
    assert "MOSTLY_Q8_0 but no Q8_0 tensor" in failing["GGUF file type"]
    assert "5.52 bpw, outside llama.cpp's 8.45–8.70" in failing["GGUF bits per weight"]


def test_nan_block_scale_in_gguf(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = _own(w / GGUF_NAME)
    g = read_gguf(path)
    t = g.tensors["blk.1.ffn_up.weight"]
    assert t.type_name == "Q4_K"
    with open(path, "r+b") as f:
        f.seek(g.abs_offset(t) + 7 * 144)  # the d scale of block 7
        f.write(np.float16(np.nan).tobytes())
    (w / "manifest.json").unlink()
    failing = _failing(verify(w))
    assert failing == {"GGUF values": "blk.1.ffn_up.weight holds Inf/NaN"}
    failing = _failing(verify(w, source="builtin:tiny"))
    assert "blk.1.ffn_up.weight (Q4_K) rel. RMSE nan" in failing["GGUF vs source"]


def test_missing_tokenizer(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    (w / "tokenizer" / "tokenizer.json").unlink()
    failing = _failing(verify(w))
    assert set(failing) == {"tokenizer files", "tokenizer loads", "manifest"}
    assert "tokenizer/tokenizer.json is missing" in failing["tokenizer files"]


def test_manifest_sha256_mismatch(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    path = _own(w / "lm_heads" / "lm_head_audio_09.npy")
    table = np.lib.format.open_memmap(path, mode="r+")
    table[0, 0] = table[0, 0] + np.float16(0.5)  # still finite, same size
    table.flush()
    del table
    failing = _failing(verify(w))
    assert failing == {"manifest": "lm_heads/lm_head_audio_09.npy: sha256 mismatch"}


def test_swapped_audio_heads_are_caught_by_source(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    heads = w / "lm_heads"
    os.rename(heads / "lm_head_audio_03.npy", heads / "tmp.npy")
    os.rename(heads / "lm_head_audio_04.npy", heads / "lm_head_audio_03.npy")
    os.rename(heads / "tmp.npy", heads / "lm_head_audio_04.npy")
    (w / "manifest.json").unlink()
    assert verify(w).ok  # same shapes, finite values: only the source can tell
    failing = _failing(verify(w, source="builtin:tiny"))
    assert set(failing) == {"tables vs source"}
    detail = failing["tables vs source"]
    assert "lm_heads/lm_head_audio_03.npy: differs from lm_heads.4.weight from row 0" in detail
    assert "lm_heads/lm_head_audio_04.npy: differs from lm_heads.5.weight from row 0" in detail


def test_gguf_of_another_model(good: Path, other_gguf: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    (w / GGUF_NAME).unlink()
    shutil.copyfile(other_gguf, w / GGUF_NAME)
    (w / "manifest.json").unlink()
    failing = _failing(verify(w))
    assert set(failing) == {"text head vs GGUF output", "text embedding vs GGUF token_embd"}
    assert "another model's?" in failing["text head vs GGUF output"]
    failing = _failing(verify(w, source="builtin:tiny", deep=True))
    assert {"GGUF vs source", "deep: hidden state", "deep: audio logits"} <= set(failing)
    assert "25 tensors" not in failing["GGUF vs source"]
    assert "token_embd.weight (Q4_K) rel. RMSE 1.4" in failing["GGUF vs source"]


def test_broken_yaml_in_the_folder(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    (w / "other.yaml").write_text("backbone_gguf: [unclosed\n")
    (w / "third.yaml").write_text(f"backbone_gguf: {GGUF_NAME}\nembedding_dir: gone\n")
    failing = _failing(verify(w))
    assert set(failing) == {"synth config", "audio tokenizer"}  # third.yaml names no codec
    assert "third.yaml: audio_decoder_onnx is not set" in failing["audio tokenizer"]
    assert "other.yaml: cannot read the YAML" in failing["synth config"]
    assert "third.yaml: embedding_dir points at a missing gone" in failing["synth config"]


def test_missing_meta(good: Path, tmp_path: Path) -> None:
    w = _clone(good, tmp_path / "w")
    (w / "extraction_meta.json").unlink()
    failing = _failing(verify(w))
    assert "extraction_meta.json is missing" in failing["model facts"]
    assert "extraction_meta.json is missing" in failing["manifest"]


# ----------------------------------------------------------------------------- the parts


def test_scale_offsets_are_the_scales_gguf_dequantizes_with() -> None:
    rng = np.random.default_rng(0)
    one, inf = np.float16(1.0).tobytes(), np.float16(np.inf).tobytes()
    for name, offsets in SCALE_OFFSETS.items():
        qtype = gguf.GGMLQuantizationType[name]
        block = bytearray(rng.integers(0, 256, gguf.GGML_QUANT_SIZES[qtype][1], dtype=np.uint8))
        for off in offsets:
            block[off : off + 2] = one
        rows = np.frombuffer(bytes(block), dtype=np.uint8).reshape(1, -1)
        assert np.isfinite(gguf.quants.dequantize(rows, qtype)).all(), name
        assert finite_blocks(bytes(block), name) is True
        for off in offsets:
            bad = bytearray(block)
            bad[off : off + 2] = inf
            rows = np.frombuffer(bytes(bad), dtype=np.uint8).reshape(1, -1)
            with np.errstate(invalid="ignore"):
                assert not np.isfinite(gguf.quants.dequantize(rows, qtype)).all(), (name, off)
            assert finite_blocks(bytes(bad), name) is False


def test_bpw_ranges_hold_llama_cpp_figures() -> None:
    # llama-quantize on builtin:tiny (vocabulary-heavy) and the guide's real MOSS-TTS figures
    measured = {
        "MOSTLY_Q4_K_M": (5.52, 4.91),
        "MOSTLY_Q5_K_M": (6.02, 5.69),
        "MOSTLY_Q6_K": (6.56, 6.56),
        "MOSTLY_Q8_0": (8.50, 8.50),
        "MOSTLY_Q2_K": (4.56, 3.0),
        "MOSTLY_F16": (16.0, 16.0),
    }
    for ftype, figures in measured.items():
        low, high = bpw_range(ftype)
        assert all(low <= f <= high for f in figures), ftype
    assert file_type_base("MOSTLY_IQ3_M") == "IQ3_S" and file_type_base("ALL_F32") == "F32"
    assert bpw_range("MOSTLY_Q4_K_M")[1] < 8.45  # a Q8_0 body labelled Q4_K_M fails


# ----------------------------------------------------------------------------- bad usage


def test_bad_targets_are_usage_errors(good: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="verify target not found"):
        verify(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a weights folder"):
        verify(tmp_path / "empty")
    bad = tmp_path / "bad.yaml"
    bad.write_text("backbone_gguf: [unclosed\n")
    with pytest.raises(InputError, match="cannot read the YAML"):
        verify(bad)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match="not a GGUF or a synth config"):
        verify(tmp_path / "notes.txt")
    with pytest.raises(InputError, match="model folder not found"):
        verify(good, source=str(tmp_path / "missing-model"))


def test_deep_needs_a_gguf_and_a_source(good: Path, tiny_extracted: Path, tmp_path: Path):
    with pytest.raises(UsageError, match="--deep runs a GGUF"):
        verify(tiny_extracted, deep=True)
    w = _clone(good, tmp_path / "w")
    meta = w / "extraction_meta.json"
    data = json.loads(meta.read_text())
    data["source_model"] = "OpenMOSS-Team/MOSS-TTS"
    meta.unlink()
    meta.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="--deep needs the source checkpoint") as err:
        verify(w, deep=True)
    assert "'OpenMOSS-Team/MOSS-TTS', not a local folder" in err.value.one_line()
    assert "pass --source MODEL" in err.value.one_line()


def test_deep_without_torch_is_a_clear_error(good: Path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(UsageError, match="--deep needs torch") as err:
        verify(good, deep=True)
    assert "(pip install 'moss-gguf[torch]')" in err.value.one_line()


# ----------------------------------------------------------------------------- CLI


def test_cli_exit_codes(good: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["verify", str(good)])
    assert result.exit_code == 0, result.output
    assert "OK: 27 checks passed" in result.stdout

    w = _clone(good, tmp_path / "w")
    (w / "tokenizer" / "tokenizer.json").unlink()
    result = runner.invoke(app, ["verify", str(w)])
    assert result.exit_code == 1
    # no tokenizer: its special-token and round-trip checks cannot run
    assert "FAILED: 3 of 26 checks failed (tokenizer files, manifest, tokenizer loads)" in (
        result.stdout
    )
    result = runner.invoke(app, ["verify", str(w), "--quiet"])
    assert result.exit_code == 1 and "tokenizer round trip" not in result.stdout

    result = runner.invoke(app, ["verify"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["verify", str(tmp_path / "nope")])
    assert result.exit_code == 2 and result.stdout == ""
    assert "verify target not found" in result.stderr


def test_cli_json_is_the_only_stdout(good: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["verify", str(good), "--json", "--source", "builtin:tiny"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["kind"] == "weights"
    assert data["counts"] == {"pass": 30, "warn": 1, "fail": 0}
    assert {r["name"] for r in data["rows"]} >= {"GGUF vs source", "manifest"}
    assert data["quality"]["by_type"]["Q6_K"]["tensors"] == 3

    w = _clone(good, tmp_path / "w")
    (w / "embeddings" / "emb_ext_00.npy").unlink()
    result = runner.invoke(app, ["verify", str(w), "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert {r["name"] for r in data["rows"] if r["status"] == "fail"} == {
        "embedding tables",
        "manifest",
    }


def test_cli_help_has_examples() -> None:
    result = runner.invoke(app, ["verify", "--help"])
    assert result.exit_code == 0
    for text in ("--source", "--deep", "--json", "Examples", "Exit status"):
        assert text in result.stdout


# ----------------------------------------------------------------------------- in-process facts


def _rows(report: VerifyReport) -> list[tuple[str, str, str]]:
    return [(r.name, r.status, r.detail) for r in report.rows]


def test_tables_written_in_this_process_give_the_same_report_unread(
    tiny_model: Path, tmp_path: Path
) -> None:
    # `all` extracts with its run's hash record; its verify then takes the writer's checks
    # instead of reading the tables again. The report must be the one a fresh read gives.
    from moss_gguf_cli.disk import digests
    from moss_gguf_cli.pipeline.extract import extract

    out = tmp_path / "ex"
    record = digests.HashRecord()
    result = extract(tiny_model, out, backbone_weights=False, record=record)
    for path in result.npy_files:
        facts, digest = record.known_table(path)
        with open(path, "rb") as f:
            assert np.lib.format.read_magic(f) == (1, 0)
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            assert (facts.shape, facts.dtype, facts.data_offset) == (shape, dtype.str, f.tell())
        assert digest == digests.sha256_file(path)
    remembered = verify(out, record=record)
    assert remembered.ok, _failing(remembered)
    assert _rows(verify(out)) == _rows(remembered)  # no record: every table read


def test_a_table_changed_after_it_was_written_is_read_again(
    tiny_model: Path, tmp_path: Path
) -> None:
    from moss_gguf_cli.disk.digests import HashRecord
    from moss_gguf_cli.pipeline.extract import extract

    out = tmp_path / "ex"
    record = HashRecord()
    extract(tiny_model, out, backbone_weights=False, record=record)
    table = np.lib.format.open_memmap(out / "embeddings" / "emb_ext_03.npy", mode="r+")
    table[7, 1] = np.nan
    table.flush()
    del table
    os.utime(out / "embeddings" / "emb_ext_03.npy")  # a new mtime, whatever the clock's grain
    failing = _failing(verify(out, record=record))
    assert "embeddings/emb_ext_03.npy: 1 Inf/NaN values (float16 overflow?), first in row 7" in (
        failing["table values"]
    )
