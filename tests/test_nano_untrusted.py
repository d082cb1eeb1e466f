"""A Nano checkpoint is untrusted input, and a folder that passes `verify` speaks: weights of odd
dtypes, NaN, heads untied from their tables and a broken tokenizer are refused by name before
anything is written; verify's rows find the same in a folder changed after `all`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from builds import Builds
from in_process import moss_gguf
from tiny_nano import CONFIG, release_state, write_release

from moss_gguf_cli.errors import InputError
from moss_gguf_cli.nano.checkpoint import open_nano
from moss_gguf_cli.nano.tiny import ensure_tiny_nano


def _untied(state: dict) -> None:
    state["audio_lm_heads.1.weight"] = state["audio_embeddings.1.weight"].clone() * 2


def _nan(state: dict) -> None:
    weight = state["transformer.h.1.mlp.fc_in.weight"].clone()
    weight[3, 4] = float("nan")
    state["transformer.h.1.mlp.fc_in.weight"] = weight


def _inf(state: dict) -> None:
    state["transformer.ln_f.bias"] = state["transformer.ln_f.bias"].clone().fill_(float("inf"))


def _as(name: str, dtype: torch.dtype):
    def edit(state: dict) -> None:
        state[name] = state[name].to(dtype)

    return edit


WEIGHTS = [
    (_untied, "'audio_lm_heads.1.weight' differs from 'audio_embeddings.1.weight'"),
    (_nan, "'transformer.h.1.mlp.fc_in.weight' holds NaN or infinite values"),
    (_inf, "'transformer.ln_f.bias' holds NaN or infinite values"),
    (_as("transformer.h.0.attn.c_proj.weight", torch.int64), "is stored as int64"),
    (_as("transformer.wte.weight", torch.float64), "'transformer.wte.weight' is stored as float64"),
    (_as("local_transformer.ln_f.weight", torch.bool), "is stored as bool"),
]


@pytest.mark.parametrize(("edit", "says"), WEIGHTS, ids=[e.__name__ for e, _ in WEIGHTS])
def test_weights_a_folder_cannot_speak_with_are_refused_by_name(tmp_path, edit, says):
    state = release_state(CONFIG)
    edit(state)
    write_release(tmp_path, CONFIG, state)
    with pytest.raises(InputError) as caught:
        open_nano(tmp_path)
    line = caught.value.one_line()
    assert says in line and "pytorch_model.bin" in line, line


def test_a_head_saved_apart_from_its_table_with_the_same_values_opens(tmp_path):
    state = release_state(CONFIG)
    state["audio_lm_heads.2.weight"] = state["audio_embeddings.2.weight"].clone()  # own storage
    write_release(tmp_path, CONFIG, state)
    opened = open_nano(tmp_path)
    np.testing.assert_array_equal(opened.tensors["audio_lm_heads.2.weight"],
                                  opened.tensors["audio_embeddings.2.weight"])  # fmt: skip


def test_all_refuses_a_garbage_tokenizer_before_any_output(tmp_path):
    source = tmp_path / "nano"
    shutil.copytree(ensure_tiny_nano(), source)
    (source / "tokenizer.model").write_bytes(b"\x0a\x05hello" + bytes(range(256)) * 4)
    out = tmp_path / "out"
    ran = moss_gguf("all", "--model", str(source), "--output", str(out), "-q",
                    "--audio-tokenizer", "none")  # fmt: skip
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1, ran.stderr
    assert "tokenizer.model" in lines[0] and "not a SentencePiece model" in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize(("name", "says"), [("config.json", "is a FIFO, not a regular file"),
                                            ("pytorch_model.bin", "is a character device")])
def test_what_a_read_would_block_on_or_never_finish_is_refused(tmp_path, name, says):
    """A FIFO blocks a reader forever and /dev/zero never ends; neither is opened."""
    source = tmp_path / "nano"
    write_release(source)
    (source / name).unlink()
    if name == "config.json":
        os.mkfifo(source / name)
    else:
        (source / name).symlink_to("/dev/zero")
    ran = moss_gguf("all", "--model", str(source), "--output", str(tmp_path / "out"), "-q")
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1, ran.stderr
    assert f"{name}: {says}" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


# ------------------------------------------------ verify: the rows that prove a folder speaks


def _rows(folder: Path, *extra: str) -> dict[str, dict]:
    ran = moss_gguf("verify", str(folder), "--json", *extra)
    report = json.loads(ran.stdout)
    assert ran.returncode == (0 if report["ok"] else 1), ran.stderr
    return {r["name"]: r for r in report["rows"]}


def _replaced(folder: Path, rel: str, data: bytes) -> None:
    """REL in a hard-linked copy given new bytes (unlinked first: the build keeps its own)."""
    (folder / rel).unlink()
    (folder / rel).write_bytes(data)


@pytest.fixture
def folder(tiny_nano_folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "w"
    Builds.copy(tiny_nano_folder, copy)
    return copy


def test_verify_passes_the_tokenizer_the_weights_and_the_copies(tiny_nano_folder):
    rows = _rows(tiny_nano_folder, "--source", "builtin:tiny-nano")
    for name in ("tokenizer", "finite weights", "copies vs source"):
        assert rows[name]["status"] == "pass", rows[name]


def test_verify_fails_a_garbage_tokenizer(folder):
    _replaced(folder, "tokenizer.model", b"not a sentencepiece model")
    row = _rows(folder)["tokenizer"]
    assert row["status"] == "fail" and "not a SentencePiece model" in row["detail"], row


def test_verify_fails_an_array_holding_nan(folder):
    rel = "local_transformer/h.0.mlp.fc_in.weight.npy"
    values = np.load(folder / rel)
    values[0, 0] = np.nan
    (folder / rel).unlink()
    np.save(folder / rel, values)
    row = _rows(folder)["finite weights"]
    assert row["status"] == "fail" and "h.0.mlp.fc_in.weight.npy holds NaN" in row["detail"], row


def test_verify_source_fails_a_config_that_is_not_the_sources(folder):
    config = json.loads((folder / "config.json").read_text())
    config["gpt2_config"]["layer_norm_epsilon"] = 2e-5  # valid, not the source's
    _replaced(folder, "config.json", json.dumps(config).encode())
    row = _rows(folder, "--source", "builtin:tiny-nano")["copies vs source"]
    assert row["status"] == "fail" and "config.json is not the source's" in row["detail"], row


def test_the_release_shaped_checkpoint_converts_and_verifies_against_its_source(
    release_nano_folder,
):
    """Written as the release is (the release's facts: float32 said over bf16 stored, nulls, no
    local_transformer.wte, special_tokens_map.json): every row passes under --source, so the
    release's quirks are not errors (test_nano_speak and test_nano_serve speak it)."""
    source = release_nano_folder.parent / "release"
    config = json.loads((source / "config.json").read_text())
    assert config["dtype"] == "float32" and config["bos_token_id"] is None
    rows = _rows(release_nano_folder, "--source", str(source))
    assert all(r["status"] == "pass" for r in rows.values()), rows
    assert rows["copies vs source"]["status"] == "pass"
