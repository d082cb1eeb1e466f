"""`extract` on real files: the guide's layout, exact values, shards, and every bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from in_process import Ran, moss_gguf
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.pipeline.extract import extract
from moss_gguf_cli.source.tiny import TinySpec, write_tiny

runner = CliRunner()


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess | Ran:
    """`moss-gguf ARGS` through the Typer app and its catch point (tests/in_process.py); with
    ENV (the Hub's variables, which huggingface_hub reads when it is imported) in a child."""
    if not env:
        return moss_gguf(*args)
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def source_tensors(model: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(model.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


# ----------------------------------------------------------------------------- the layout


def test_layout_names_and_dtypes(tiny_extracted: Path) -> None:
    emb = sorted(p.name for p in (tiny_extracted / "embeddings").iterdir())
    heads = sorted(p.name for p in (tiny_extracted / "lm_heads").iterdir())
    assert emb == sorted(["embed_tokens.npy"] + [f"emb_ext_{i:02d}.npy" for i in range(32)])
    assert heads == [f"lm_head_audio_{i:02d}.npy" for i in range(32)] + ["lm_head_text.npy"]
    for path in [
        *(tiny_extracted / "embeddings").iterdir(),
        *(tiny_extracted / "lm_heads").iterdir(),
    ]:
        arr = np.load(path, mmap_mode="r")
        assert arr.dtype == np.float16, path
    assert np.load(tiny_extracted / "embeddings/embed_tokens.npy", mmap_mode="r").shape == (
        151936,
        256,
    )
    assert np.load(tiny_extracted / "lm_heads/lm_head_audio_31.npy", mmap_mode="r").shape == (
        1025,
        256,
    )


def test_every_table_equals_its_source_after_the_f16_cast(tiny_model: Path, tiny_extracted: Path):
    src = source_tensors(tiny_model)
    pairs = {
        "embeddings/embed_tokens.npy": "language_model.embed_tokens.weight",
        "lm_heads/lm_head_text.npy": "lm_heads.0.weight",
    }
    for i in range(32):
        pairs[f"embeddings/emb_ext_{i:02d}.npy"] = f"emb_ext.{i}.weight"
        pairs[f"lm_heads/lm_head_audio_{i:02d}.npy"] = f"lm_heads.{i + 1}.weight"
    for rel, name in pairs.items():
        expected = src[name].to(torch.float16).numpy()
        got = np.load(tiny_extracted / rel)
        assert got.shape == expected.shape, rel
        assert np.array_equal(got.view(np.uint16), expected.view(np.uint16)), rel


def test_backbone_is_a_standalone_qwen3(tiny_model: Path, tiny_extracted: Path) -> None:
    backbone = tiny_extracted / "qwen3_backbone"
    src = source_tensors(tiny_model)
    got = source_tensors(backbone)
    expected_names = {
        "model." + n[len("language_model.") :] for n in src if n.startswith("language_model.")
    } | {"lm_head.weight"}
    assert set(got) == expected_names
    for name, tensor in got.items():
        origin = "lm_heads.0.weight" if name == "lm_head.weight" else "language_model." + name[6:]
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, src[origin]), name
    config = json.loads((backbone / "config.json").read_text())
    source_lang = json.loads((tiny_model / "config.json").read_text())["language_config"]
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    assert "_name_or_path" not in config
    assert config["torch_dtype"] == "bfloat16"
    assert config["hidden_size"] == source_lang["hidden_size"] == 256
    assert config["tie_word_embeddings"] is False
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        assert (backbone / name).read_bytes() == (tiny_model / name).read_bytes()
    # one shard under the default 5 GB limit: no index, as Hugging Face does
    assert (backbone / "model.safetensors").is_file()
    assert not (backbone / "model.safetensors.index.json").exists()


def test_meta(tiny_model: Path, tiny_extracted: Path) -> None:
    meta = json.loads((tiny_extracted / "extraction_meta.json").read_text())
    assert meta["source_model"] == "builtin:tiny"
    assert (meta["n_vq"], meta["hidden_size"], meta["vocab_size"], meta["audio_vocab_size"]) == (
        32,
        256,
        151936,
        1024,
    )
    assert (meta["backbone_dir"], meta["embedding_dir"], meta["lm_head_dir"]) == (
        "qwen3_backbone",
        "embeddings",
        "lm_heads",
    )
    assert meta["moss_config"] == json.loads((tiny_model / "config.json").read_text())


def test_small_max_shard_size_splits_with_an_index(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "x"
    result = runner.invoke(
        app,
        [
            "extract",
            "--model",
            str(tiny_model),
            "--output",
            str(out),
            "--max-shard-size",
            "40MB",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    backbone = out / "qwen3_backbone"
    shards = sorted(backbone.glob("model-*.safetensors"))
    # embed_tokens (77.8 MB) alone, then the layers and norm, then lm_head alone
    assert [s.name for s in shards] == [f"model-{i:05d}-of-00003.safetensors" for i in range(1, 4)]
    assert list(load_file(shards[0])) == ["model.embed_tokens.weight"]
    assert list(load_file(shards[2])) == ["lm_head.weight"]
    index = json.loads((backbone / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in shards:
        loaded = load_file(shard)
        assert sum(t.numel() * 2 for t in loaded.values()) <= 40e6 or len(loaded) == 1
        tensors.update({k: shard.name for k in loaded})
    assert index["weight_map"] == tensors
    assert index["metadata"]["total_size"] == sum(
        t.numel() * 2 for s in shards for t in load_file(s).values()
    )


def test_float32_tables(tiny_model: Path, tmp_path: Path) -> None:
    extract(tiny_model, tmp_path / "f32", npy_dtype="float32")
    got = np.load(tmp_path / "f32/lm_heads/lm_head_audio_05.npy")
    expected = source_tensors(tiny_model)["lm_heads.6.weight"].float().numpy()
    assert got.dtype == np.float32 and np.array_equal(got, expected)


def test_existing_output_needs_force(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_cli("extract", "--model", str(tiny_model), "--output", str(out))
    assert proc.returncode == 1
    assert "not empty" in proc.stderr and "--force" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    proc = run_cli("extract", "--model", str(tiny_model), "--output", str(out), "--force", "-q")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "keep.txt").exists() and (out / "extraction_meta.json").is_file()
    assert leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- bad input


def copy_model(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def truncate(path: Path, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - nbytes)


def write_header(path: Path, header: bytes, declared: int | None = None) -> None:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    length = len(header) if declared is None else declared
    path.write_bytes(length.to_bytes(8, "little") + header + data[8 + n :])


def _shard1(m: Path) -> Path:
    return m / "model-00001-of-00002.safetensors"


def _header_json(m: Path) -> dict:
    data = _shard1(m).read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n])


def _corrupt_offsets(m: Path) -> None:
    header = _header_json(m)
    name = next(k for k in header if k != "__metadata__")
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**9, end + 10**9]
    write_header(_shard1(m), json.dumps(header).encode())


def _drop_tensor(m: Path, tensor: str) -> None:
    def fn(index: dict) -> None:
        del index["weight_map"][tensor]

    edit_json(m / "model.safetensors.index.json", fn)
    shard = next(p for p in m.glob("*.safetensors") if tensor in _header_of(p))
    tensors = load_file(shard)
    del tensors[tensor]
    save_file(tensors, shard, metadata={"format": "pt"})


def _header_of(path: Path) -> dict:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n])


def _only_bin(m: Path) -> None:
    for p in m.glob("*.safetensors"):
        p.unlink()
    (m / "model.safetensors.index.json").unlink()
    (m / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")


def _lang(**values) -> object:
    return lambda m: edit_json(m / "config.json", lambda c: c["language_config"].update(values))


def _shaped(shape: list[int]) -> object:
    def fn(m: Path) -> None:
        header = _header_json(m)
        name = next(k for k in header if k != "__metadata__")
        header[name]["shape"] = shape
        write_header(_shard1(m), json.dumps(header).encode())

    return fn


def _fifo(name: str) -> object:
    return lambda m: ((m / name).unlink(), os.mkfifo(m / name))


def _as_int64(tensor: str) -> object:
    def fn(m: Path) -> None:
        shard = next(p for p in m.glob("*.safetensors") if tensor in _header_of(p))
        tensors = load_file(shard)
        tensors[tensor] = tensors[tensor].to(torch.int64)  # what a careless export may hold
        save_file(tensors, shard, metadata={"format": "pt"})

    return fn


def _index_to(m: Path, rel: str) -> None:
    def fn(index: dict) -> None:
        index["weight_map"]["emb_ext.0.weight"] = rel

    edit_json(m / "model.safetensors.index.json", fn)


BAD_INPUTS = {
    "missing config": (lambda m: (m / "config.json").unlink(), "config.json is missing"),
    "plain qwen3": (
        lambda m: edit_json(
            m / "config.json",
            lambda c: (
                c.clear(),
                c.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}),
            ),
        ),
        "plain qwen3 checkpoint, not MOSS-TTS",
    ),
    "index names a missing shard": (
        lambda m: _shard1(m).unlink(),
        "shard model-00001-of-00002.safetensors named by the index is missing",
    ),
    "shard path with ..": (
        lambda m: _index_to(m, "../model-00001-of-00002.safetensors"),
        "points outside the model folder",
    ),
    "absolute shard path": (
        lambda m: _index_to(m, "/etc/passwd"),
        "points outside the model folder",
    ),
    "truncated shard": (lambda m: truncate(_shard1(m), 1000), "past the end"),
    "bad header length": (
        lambda m: write_header(_shard1(m), b"{}", declared=1 << 40),
        "bad safetensors header length",
    ),
    "bad header json": (
        lambda m: write_header(_shard1(m), b'{"a": [1, 2' + b" " * 5),
        "header is not valid JSON",
    ),
    "offsets past the end": (_corrupt_offsets, "past the end"),
    "missing emb_ext": (
        lambda m: _drop_tensor(m, "emb_ext.7.weight"),
        "n_vq is 32 but the weights hold 31 audio tables",
    ),
    "missing lm_head": (
        lambda m: _drop_tensor(m, "lm_heads.12.weight"),
        "'lm_heads.12.weight' is missing",
    ),
    "n_vq disagrees": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(n_vq=31)),
        "n_vq is 31 but the weights hold 32 audio tables",
    ),
    "audio vocab disagrees": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(audio_vocab_size=2048)),
        "config implies [2049, 256]",
    ),
    "only pickles": (_only_bin, "only pickled weights"),
    # a checkpoint is untrusted input: values a ggml assertion would meet, counts that become
    # gigabytes of names before a tensor is read, ids past their table, weights of odd dtypes
    "negative eps": (_lang(rms_norm_eps=-1), "rms_norm_eps is -1, not a number between 0"),
    "rope base 0": (_lang(rope_theta=0), "rope_theta is 0, not a number between 1"),
    "3e6 layers": (_lang(num_hidden_layers=3e6), "num_hidden_layers is 3000000, more than any"),
    "3e8 codebooks": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(n_vq=3e8)),
        "n_vq is 300000000, more than any MOSS-TTS",
    ),
    "layers disagree": (_lang(num_hidden_layers=3), "is 3 but the weights hold 2 layers"),
    "kv heads": (_lang(num_key_value_heads=3), "is not a multiple of num_key_value_heads 3"),
    "an id past the vocabulary": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(im_end_token_id=10**6)),
        "im_end_token_id 1000000 is outside the table of 151936 rows",
    ),
    "an id of 1e30": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(audio_pad_code=1e30)),
        "audio_pad_code is 1e+30, not a token id",
    ),
    "an int64 weight": (_as_int64("emb_ext.3.weight"), "'emb_ext.3.weight' is stored as I64"),
    # malformed files that ended in "unexpected RecursionError/OverflowError/TypeError"
    "config nested 100k deep": (
        lambda m: (m / "config.json").write_text("[" * 100_000 + "]" * 100_000),
        "config.json is not valid JSON (maximum recursion depth exceeded",
    ),
    "a count of 401 digits": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(n_vq=10**400)),
        "n_vq is a number of 401 digits, more than any MOSS-TTS has",
    ),
    "architectures a number": (
        lambda m: edit_json(m / "config.json", lambda c: c.update(architectures=5, model_type="x")),
        "model_type 'x' is not a MOSS delay model",
    ),
    "a header nested 100k deep": (
        lambda m: write_header(_shard1(m), b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "safetensors header is not valid JSON (maximum recursion depth exceeded",
    ),
    "a shape of 2^70 x 2^70": (_shaped([2**70, 2**70]), "that do not fit its shape [1180591620717"),
    "a negative dimension": (_shaped([-1, 4]), "has a negative dimension in [-1, 4]"),
    # where a file belongs, something a read would block on or never finish
    "config is a FIFO": (_fifo("config.json"), "config.json: is a FIFO, not a regular file"),
    "a shard is a FIFO": (
        _fifo("model-00001-of-00002.safetensors"),
        "model-00001-of-00002.safetensors: is a FIFO, not a regular file",
    ),
    "a shard links to /dev/zero": (
        lambda m: (_shard1(m).unlink(), _shard1(m).symlink_to("/dev/zero")),
        "shard 'model-00001-of-00002.safetensors' points outside the model folder",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_writes_nothing(case: str, tiny_model: Path, tmp_path: Path):
    breaker, message = BAD_INPUTS[case]
    model = copy_model(tiny_model, tmp_path / "model")
    breaker(model)
    out = tmp_path / "out"
    proc = run_cli("extract", "--model", str(model), "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_debug_shows_the_traceback(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "model")
    (model / "config.json").unlink()
    proc = run_cli(
        "extract",
        "--model",
        str(model),
        "--output",
        str(tmp_path / "o"),
        env={"MOSS_GGUF_DEBUG": "1"},
    )
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def _checkpoint_with(tmp_path: Path, edit) -> Path:
    """A tiny checkpoint whose tensors we change before writing (values the cast must catch)."""
    import moss_gguf_cli.source.tiny as tiny

    model = tmp_path / "model"
    model.mkdir()
    original = tiny._values

    def patched(rng, name, shape):  # tiny._values, called per row block since 367edbd
        return edit(name, original(rng, name, shape))

    tiny._values = patched
    try:
        write_tiny(model, TinySpec(vocab=151680, shards=1))
    finally:
        tiny._values = original
    return model


def test_float16_overflow_names_the_tensor(tmp_path: Path) -> None:
    def big(name, values):
        if name == "emb_ext.3.weight":
            values[5, 7] = 1.0e5
        return values

    model = _checkpoint_with(tmp_path, big)
    proc = run_cli("extract", "--model", str(model), "--output", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert "'emb_ext.3.weight' has values beyond the float16 range" in proc.stderr
    assert "--npy-dtype float32" in proc.stderr
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    ok = run_cli(
        "extract",
        "--model",
        str(model),
        "--output",
        str(tmp_path / "out"),
        "--npy-dtype",
        "float32",
        "-q",
    )
    assert ok.returncode == 0, ok.stderr
    assert np.load(tmp_path / "out/embeddings/emb_ext_03.npy")[5, 7] == 99840.0  # bf16 of 1e5


def test_nan_in_source_is_reported(tmp_path: Path) -> None:
    def nan(name, values):
        if name == "lm_heads.9.weight":
            values[0, 0] = np.nan
        return values

    model = _checkpoint_with(tmp_path, nan)
    proc = run_cli(
        "extract",
        "--model",
        str(model),
        "--output",
        str(tmp_path / "out"),
        "--npy-dtype",
        "float32",
    )
    assert proc.returncode == 1
    assert "'lm_heads.9.weight' holds NaN or Inf in the source" in proc.stderr


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 20 MB filesystem: too small for the extraction."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_not_enough_disk_is_checked_before_writing(tiny_model: Path, small_disk: Path) -> None:
    out = small_disk / "out"
    proc = run_cli("extract", "--model", str(tiny_model), "--output", str(out))
    assert proc.returncode == 1
    assert "of free disk" in proc.stderr and "larger disk" in proc.stderr
    assert list(small_disk.iterdir()) == []


def test_killed_run_leaves_nothing_complete_and_rerun_succeeds(
    tiny_model: Path, tmp_path: Path, held_run
):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "moss_gguf_cli", "extract", "--model", str(tiny_model)]
    proc = held_run(cmd + ["--output", str(out), "-q"], "extract")
    assert list(tmp_path.glob(".out.partial-*/embeddings/*.npy"))  # a table is written
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert leftovers(tmp_path)  # only a hidden partial, never the real name
    rerun = run_cli("extract", "--model", str(tiny_model), "--output", str(out), "-q")
    assert rerun.returncode == 0, rerun.stderr
    assert (out / "extraction_meta.json").is_file()
    assert leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- the Hub path


def hub_cache(tmp_path: Path, model: Path, repo_id: str) -> Path:
    """A Hugging Face cache folder holding model as repo_id at a fixed commit."""
    cache = tmp_path / "hub"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = repo / "snapshots" / commit
    shutil.copytree(model, snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return cache


def test_hub_id_works_offline_from_a_local_cache(tiny_model: Path, tmp_path: Path) -> None:
    cache = hub_cache(tmp_path, tiny_model, "OpenMOSS-Team/MOSS-TTS")
    out = tmp_path / "out"
    proc = run_cli(
        "extract",
        "--model",
        "OpenMOSS-Team/MOSS-TTS",
        "--cache-dir",
        str(cache),
        "--output",
        str(out),
        "-q",
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "extraction_meta.json").read_text())
    assert meta["source_model"] == "OpenMOSS-Team/MOSS-TTS"
    assert np.array_equal(
        np.load(out / "lm_heads/lm_head_audio_00.npy"),
        source_tensors(tiny_model)["lm_heads.1.weight"].half().numpy(),
    )


def test_hub_id_missing_from_the_offline_cache(tmp_path: Path) -> None:
    proc = run_cli(
        "extract",
        "--model",
        "OpenMOSS-Team/Not-There",
        "--cache-dir",
        str(tmp_path / "empty"),
        "--output",
        str(tmp_path / "out"),
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 2
    assert "not in the local Hub cache" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_missing_local_folder(tmp_path: Path) -> None:
    proc = run_cli("extract", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "model folder not found" in proc.stderr


def test_unknown_builtin(tmp_path: Path) -> None:
    proc = run_cli("extract", "--model", "builtin:huge", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "builtin:tiny" in proc.stderr


def test_version_and_help() -> None:
    from moss_gguf_cli import __version__

    assert run_cli("--version").stdout.strip() == f"moss-gguf {__version__}"
    for cmd in ("extract", "convert", "quantize", "all", "layout", "verify", "synth"):
        result = runner.invoke(app, [cmd, "--help"])
        assert result.exit_code == 0, cmd
