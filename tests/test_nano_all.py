"""`all` on MOSS-TTS-Nano, end to end with the real CLI: builtin:tiny-nano, a local release
folder written by torch.save, and the Hub id offline (huggingface_hub's own cache layout); the
folder's files read back (GGUFs by llama.cpp, arrays against the source); `verify` catching a
tampered tensor and a wrong permutation; options Nano has no use for refused in one line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file
from test_hub_weights import add_repo, files_of, run
from tiny_nano import nano_config, release_state, write_release

from moss_gguf_cli.gguf.read import read_gguf
from moss_gguf_cli.nano.checkpoint import expected_shapes, open_nano, tied_names
from moss_gguf_cli.nano.codec_folder import DEFAULT_REPO as CODEC_REPO
from moss_gguf_cli.nano.convert import HUB_PATTERNS
from moss_gguf_cli.nano.global_gguf import neox_order, write_global_f32
from moss_gguf_cli.nano.layout import array_files, array_of
from moss_gguf_cli.nano.tiny import ensure_tiny_nano, ensure_tiny_nano_codec_folder
from moss_gguf_cli.quantize.llama import quantize
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings
from moss_gguf_cli.verify.quality import DEEP_THRESHOLDS

HUB_ID = "OpenMOSS-Team/MOSS-TTS-Nano-100M"
# dims a Q8_0 block row divides (32) and K-quants take (256) in the global blocks
LOCAL = nano_config(n_embd=256, n_head=4, n_inner=512, vocab_size=384, n_positions=256)


def cli(*args: str, cache: Path) -> tuple[int, str, str]:
    done = run(*args, cache=cache)
    return done.returncode, done.stdout, done.stderr


def listed(folder: Path) -> dict[str, dict]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return {f["path"]: f for f in manifest["files"]}


def hidden(gguf: Path, rows: np.ndarray) -> np.ndarray:
    settings = BackboneSettings(n_ctx=64, n_batch=64, n_threads=2, kv_cache_type_k="f32",
                                kv_cache_type_v="f32", flash_attn="disabled")  # fmt: skip
    with Backbone(gguf, settings) as backbone:
        return backbone.hidden_states(rows)


@pytest.fixture(scope="module")
def builtin_folder(builds) -> Path:
    built = builds.all("--model", "builtin:tiny-nano")  # the run's shared build
    out, stdout = built.path, built.stdout
    # every row passes (how many rows there are is verify/nano.py's to say)
    assert re.search(r"verify: \d+ passed, 0 warnings, 0 failed", stdout), stdout
    assert f"speak it: moss-gguf synth --config {out / 'moss-tts-nano.yaml'}" in stdout
    return out


def test_the_builtin_becomes_a_complete_folder(builtin_folder):
    out = builtin_folder
    files = listed(out)
    top = ["config.json", "moss-tts-nano.yaml", "nano_global_q8_0.gguf", "tokenizer.model"]
    assert sorted(p for p in files if "/" not in p) == top
    for rel, entry in files.items():  # every file, as listed
        data = (out / rel).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"])
    assert sum(1 for p in files if p.startswith("tables/")) == 17
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "moss-tts-nano"
    assert manifest["quant_types"] == {"nano_global_q8_0.gguf": "Q8_0"}  # Nano's default
    assert manifest["made_from"]["source"] == {"model": "builtin:tiny-nano"}
    assert manifest["audio_tokenizer"] == "builtin"
    assert read_gguf(out / "nano_global_q8_0.gguf").kv["general.file_type"] == 7  # MOSTLY_Q8_0
    source = ensure_tiny_nano()
    assert (out / "tokenizer.model").read_bytes() == (source / "tokenizer.model").read_bytes()
    codec = ensure_tiny_nano_codec_folder()
    assert files_of(out / "audio_tokenizer").keys() == files_of(codec).keys() - {".version"}
    config = yaml.safe_load((out / "moss-tts-nano.yaml").read_text())
    assert config["family"] == "moss-tts-nano" and config["global_gguf"] == "nano_global_q8_0.gguf"
    opened = open_nano(source)
    for rel, name in array_files(opened.nano).items():
        array = np.load(out / rel)
        assert array.dtype == np.float32 and np.array_equal(array, array_of(opened, name)), rel


def test_the_builtin_manifest_has_no_dtype_note(builtin_folder):
    """builtin:tiny-nano's config says no dtype: its manifest is as it always was."""
    manifest = json.loads((builtin_folder / "manifest.json").read_text())
    assert "notes" not in manifest
    assert list(manifest["model"]) == ["n_vq", "hidden_size", "vocab_size", "num_layers",
                                       "local_layers", "npy_dtype"]  # fmt: skip


def test_the_release_shaped_checkpoint_converts_with_its_dtype_noted(release_nano_folder):
    """The checkpoint in the release's exact shape (conftest, tiny_nano.write_as_release): its
    files, its 194-name layout (no local_transformer.wte) in bf16 under a config saying
    float32. `all` reads the weights as stored, passes verify, and says the disagreement: in
    its output and in the manifest."""
    out, source = release_nano_folder, release_nano_folder.parent / "release"
    assert sorted(p.name for p in source.iterdir()) == [
        "config.json", "pytorch_model.bin", "special_tokens_map.json", "tokenizer.model",
        "tokenizer_config.json"]  # fmt: skip
    config = json.loads((source / "config.json").read_text())
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    assert len(config["gpt2_config"]) == 80 and config["gpt2_config"]["dtype"] is None
    loaded = torch.load(source / "pytorch_model.bin", weights_only=True)
    opened = open_nano(source)
    assert sorted(loaded) == sorted(expected_shapes(opened.nano))  # the release's names
    assert "local_transformer.wte.weight" not in loaded and opened.unused == []
    assert {t.dtype for t in loaded.values()} == {torch.bfloat16}
    for head, table in tied_names(opened.nano).items():
        assert loaded[head].data_ptr() == loaded[table].data_ptr(), head
    note = ("config.json says dtype float32 but pytorch_model.bin stores bfloat16; the weights "
            "are read as stored (bfloat16)")  # fmt: skip
    assert opened.dtype_note == note
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["notes"] == [note]
    assert (manifest["model"]["weights_dtype"], manifest["model"]["config_dtype"]) == \
        ("bfloat16", "float32")  # fmt: skip
    stdout, stderr = (source.parent / name for name in ("all.stdout", "all.stderr"))
    assert f"note: {note}" in " ".join(stderr.read_text().split())
    assert re.search(r"verify: \d+ passed, 0 warnings, 0 failed", stdout.read_text())
    for name in ("config.json", "tokenizer.model"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    for rel, name in array_files(opened.nano).items():  # bf16 widened exactly
        assert np.array_equal(np.load(out / rel), loaded[name].float().numpy()), rel


@pytest.mark.parametrize("kind", ["bin-bf16", "safetensors-f32"])
def test_a_local_release_folder_converts_and_llama_runs_each_type(tmp_path, kind):
    folder = tmp_path / "release"
    if kind == "bin-bf16":
        write_release(folder, LOCAL, release_state(LOCAL, torch.bfloat16))
    else:  # safetensors beside the .bin is read instead; it holds the tables, not the heads
        write_release(folder, LOCAL, release_state(LOCAL, torch.float32))
        state = release_state(LOCAL, torch.float32, seed=2)
        save_file({n: t for n, t in state.items() if "lm_head" not in n},
                  str(folder / "model.safetensors"))  # fmt: skip
    shutil.copyfile(ensure_tiny_nano() / "tokenizer.model", folder / "tokenizer.model")
    out = tmp_path / "w"
    rc, _, stderr = cli("all", "--model", str(folder), "--output", str(out), "--file-type",
                        "F32", "--file-type", "Q4_K_M", "--audio-tokenizer",
                        str(ensure_tiny_nano_codec_folder()), cache=tmp_path)  # fmt: skip
    assert rc == 0, stderr
    made = json.loads((out / "manifest.json").read_text())["made_from"]["source"]
    assert made["folder"] == str(folder.resolve())
    opened = open_nano(folder)
    assert opened.weights.name == ("pytorch_model.bin" if kind == "bin-bf16" else
                                   "model.safetensors")  # fmt: skip
    f32 = out / "nano_global_f32.gguf"
    assert f32.read_bytes() == write_global_f32(opened, tmp_path / "again.gguf").read_bytes()
    rows = np.asarray(opened.tensors["transformer.wte.weight"], np.float32)[10:34]
    exact, q4 = hidden(f32, rows), hidden(out / "nano_global_q4_k_m.gguf", rows)
    cosine = np.sum(exact * q4, 1) / np.linalg.norm(exact, axis=1) / np.linalg.norm(q4, axis=1)
    # verify's 4-bit limit for hidden states (quality.DEEP_THRESHOLDS); measured 0.983 here
    assert cosine.min() > DEEP_THRESHOLDS["4bit"][0], cosine.min()


def test_the_hub_id_is_nano_offline_with_its_codec(tmp_path):
    cache = tmp_path / "hub"
    folder = tmp_path / "release"
    write_release(folder, LOCAL, release_state(LOCAL, torch.bfloat16))
    shutil.copyfile(ensure_tiny_nano() / "tokenizer.model", folder / "tokenizer.model")
    (folder / "README.md").write_text("not downloaded: not in the patterns\n")
    add_repo(cache, HUB_ID, files_of(folder))
    add_repo(cache, CODEC_REPO, files_of(ensure_tiny_nano_codec_folder()))
    out = tmp_path / "w"
    rc, stdout, stderr = cli("all", "--model", HUB_ID, "--output", str(out), cache=cache)
    assert rc == 0, stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["made_from"]["source"]["repo"] == HUB_ID
    assert manifest["audio_tokenizer"] == CODEC_REPO
    assert "nano_global_q8_0.gguf" in manifest["quant_types"]
    # what the download asks for: the release's files, and not its README
    wanted = [n for n in files_of(folder) if any(fnmatch(n, p) for p in HUB_PATTERNS)]
    assert sorted(wanted) == ["config.json", "pytorch_model.bin", "tokenizer.model"]


def verify_rows(folder: Path, *extra: str) -> dict[str, dict]:
    rc, stdout, stderr = cli("verify", str(folder), "--json", *extra, cache=folder.parent)
    report = json.loads(stdout)
    assert rc == (0 if report["ok"] else 1), stderr
    return {r["name"]: r for r in report["rows"]}


def relist(folder: Path, rel: str) -> None:
    """The manifest made to agree with a changed file: only the values can tell."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["files"]:
        if entry["path"] == rel:
            data = (folder / rel).read_bytes()
            entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    path.write_text(json.dumps(manifest))


def test_a_failing_final_verify_removes_the_folder(tmp_path, monkeypatch):
    """A table changed between the write and verify (at the run's verify hold point): the
    run fails in one line, and nothing of the folder is left, nor anything beside it."""
    from in_process import moss_gguf

    out = tmp_path / "w"
    (tmp_path / "mine.txt").write_text("not the run's")

    def spoil_at_verify(point: str) -> None:
        if point == "verify":
            table = out / "tables" / "audio_embeddings_03.npy"
            values = np.load(table)
            values[5, 7] += 1e-3
            np.save(out / "spoiled.npy", values)
            os.replace(out / "spoiled.npy", table)

    monkeypatch.setattr("moss_gguf_cli.nano.convert.hold", spoil_at_verify)
    ran = moss_gguf("all", "--model", "builtin:tiny-nano", "--output", str(out), "-q")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    line = ran.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, ran.stderr
    assert line.startswith(f"error: {out}: verify failed: manifest files: "), line
    assert "also arrays vs source (2 failing checks)" in line, line
    assert "the folder was removed" in line and "-v" in line, line
    assert "speak it" not in ran.stdout  # no summary of a folder that is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    assert (tmp_path / "mine.txt").read_text() == "not the run's"


def test_verify_passes_the_folder_and_checks_the_source(builtin_folder):
    for extra in ((), ("--source", "builtin:tiny-nano"), ("--deep",)):
        rows = verify_rows(builtin_folder, *extra)
        assert all(r["status"] == "pass" for r in rows.values()), rows
        assert "nano_global_q8_0.gguf: values vs source" in rows and "arrays vs source" in rows
    assert "nano_global_q8_0.gguf: llama.cpp vs exact" in rows  # --deep's row


def test_verify_without_the_source_says_the_values_are_unchecked(builtin_folder, tmp_path):
    out = tmp_path / "w"
    shutil.copytree(builtin_folder, out)
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["made_from"]["source"] = {"folder": str(tmp_path / "gone")}
    path.write_text(json.dumps(manifest))
    row = verify_rows(out)["values vs source"]
    assert row["status"] == "warn" and "not checked" in row["detail"]
    rc, _, stderr = cli("verify", str(out), "--deep", cache=tmp_path)
    assert rc == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "the source is not here" in stderr


def test_verify_catches_a_tampered_tensor(builtin_folder, tmp_path):
    out = tmp_path / "w"
    shutil.copytree(builtin_folder, out)
    gguf = out / "nano_global_q8_0.gguf"
    g = read_gguf(gguf)
    t = g.tensors["blk.1.ffn_up.weight"]
    with open(gguf, "r+b") as f:  # one Q8_0 block's 32 values turned around
        f.seek(g.abs_offset(t) + 2)
        block = f.read(32)
        f.seek(g.abs_offset(t) + 2)
        f.write(bytes((256 - b) % 256 for b in block))
    assert verify_rows(out)["manifest files"]["status"] == "fail"
    relist(out, gguf.name)
    rows = verify_rows(out)
    assert rows["manifest files"]["status"] == "pass"
    row = rows["nano_global_q8_0.gguf: values vs source"]
    assert row["status"] == "fail" and "blk.1.ffn_up.weight" in row["detail"], row
    table = out / "tables" / "audio_embeddings_03.npy"
    values = np.load(table)
    values[5, 7] += 1e-3
    np.save(table, values)
    relist(out, "tables/audio_embeddings_03.npy")
    row = verify_rows(out)["arrays vs source"]
    assert row["status"] == "fail" and "audio_embeddings_03" in row["detail"]


def test_verify_catches_a_wrong_permutation(builtin_folder, tmp_path):
    """The q/k rows written as upstream has them (no permutation), quantized by llama.cpp:
    the header is right, the values are not."""
    out = tmp_path / "w"
    shutil.copytree(builtin_folder, out)
    opened = open_nano(ensure_tiny_nano())
    dims = opened.nano.dims
    back = np.argsort(neox_order(dims.head_dim))
    undo = np.arange(3 * dims.hidden)
    for start in range(0, 2 * dims.hidden, dims.head_dim):
        undo[start : start + dims.head_dim] = start + back
    tensors = dict(opened.tensors)
    for i in range(dims.layers):
        for kind in ("weight", "bias"):
            name = f"transformer.h.{i}.attn.c_attn.{kind}"
            tensors[name] = np.asarray(tensors[name], np.float32)[undo]
    f32 = write_global_f32(replace(opened, tensors=tensors), tmp_path / "unpermuted.gguf")
    gguf = out / "nano_global_q8_0.gguf"
    quantize(f32, gguf, "Q8_0", force=True)
    relist(out, gguf.name)
    rows = verify_rows(out)
    assert rows["nano_global_q8_0.gguf: header"]["status"] == "pass"
    row = rows["nano_global_q8_0.gguf: values vs source"]
    assert row["status"] == "fail" and "attn_qkv" in row["detail"], row
    row = verify_rows(out, "--deep")["nano_global_q8_0.gguf: llama.cpp vs exact"]
    assert row["status"] == "fail", row  # llama.cpp runs it, on the wrong pairs


@pytest.mark.parametrize(
    ("extra", "said"),
    [(["--format", "moss-tts-delay"], "--format moss-tts-delay does not apply to MOSS-TTS-Nano"),
     (["--engine", "direct"], "the direct engine reads delay checkpoints only"),
     (["--keep-intermediate"], "--keep-intermediate does not apply to MOSS-TTS-Nano"),
     (["--merge-lora", "an-adapter"], "--merge-lora does not apply to MOSS-TTS-Nano"),
     (["--base-model", "OpenMOSS-Team/MOSS-TTS-Nano-100M"],
      "--base-model does not apply to MOSS-TTS-Nano"),
     (["--audio-tables-type", "f16"], "--audio-tables-type does not apply to MOSS-TTS-Nano")],
)  # fmt: skip
def test_options_nano_has_no_use_for_are_refused_in_one_line(tmp_path, extra, said):
    rc, _, stderr = cli("all", "--model", "builtin:tiny-nano", "--output", str(tmp_path / "w"),
                        *extra, cache=tmp_path)  # fmt: skip
    assert rc == 2 and len(stderr.strip().splitlines()) == 1 and said in stderr, stderr
    assert not (tmp_path / "w").exists()


def test_a_folder_without_its_tokenizer_is_refused_before_any_output(tmp_path):
    write_release(tmp_path / "nano")
    rc, _, stderr = cli("all", "--model", str(tmp_path / "nano"), "--output",
                        str(tmp_path / "w"), cache=tmp_path)  # fmt: skip
    assert rc == 2 and "tokenizer.model is missing" in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nano"]
