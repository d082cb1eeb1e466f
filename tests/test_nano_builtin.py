"""builtin:tiny-nano (nano/tiny.py): the release's layout made without torch; torch's own
reader takes its pytorch_model.bin bit for bit with the ties kept, nano/ opens it, and its
tokenizer.model is the one scripts/make_tiny_nano_tokenizer.py makes, laid out as the release's."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
from sentencepiece import sentencepiece_model_pb2

from moss_gguf_cli.nano.checkpoint import open_nano, tied_names
from moss_gguf_cli.nano.codec_folder import open_nano_codec
from moss_gguf_cli.nano.tiny import (
    CONFIG,
    ensure_tiny_nano,
    ensure_tiny_nano_codec_folder,
    tiny_nano_state,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_folder_holds_the_releases_three_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MOSS_GGUF_CACHE", str(tmp_path))
    folder = ensure_tiny_nano()
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "pytorch_model.bin", "tokenizer.model"]  # fmt: skip
    assert json.loads((folder / "config.json").read_text()) == CONFIG
    assert ensure_tiny_nano() == folder  # cached


def test_torch_load_reads_the_bin_bit_for_bit_with_ties(tmp_path, monkeypatch):
    monkeypatch.setenv("MOSS_GGUF_CACHE", str(tmp_path))
    loaded = torch.load(ensure_tiny_nano() / "pytorch_model.bin", weights_only=True)
    state = tiny_nano_state()
    assert list(loaded) == list(state)
    for name, array in state.items():
        assert loaded[name].dtype == torch.bfloat16, name
        assert loaded[name].view(torch.int16).numpy().tobytes() == array.tobytes(), name
    opened = open_nano(ensure_tiny_nano())
    for head, table in tied_names(opened.nano).items():
        assert loaded[head].data_ptr() == loaded[table].data_ptr(), head
        assert np.shares_memory(opened.tensors[head], opened.tensors[table]), head
    assert opened.unused == ["local_transformer.wte.weight"]
    assert opened.nano.n_vq == 16 and opened.nano.codebook_sizes == (1024,) * 16


def test_the_tokenizer_is_the_scripts_and_laid_out_as_the_releases(tmp_path, monkeypatch):
    monkeypatch.setenv("MOSS_GGUF_CACHE", str(tmp_path))
    path = ensure_tiny_nano() / "tokenizer.model"
    spec = importlib.util.spec_from_file_location(
        "make", ROOT / "scripts/make_tiny_nano_tokenizer.py"
    )
    make = importlib.util.module_from_spec(spec)
    sys.modules["make"] = make
    spec.loader.exec_module(make)
    assert path.read_bytes() == make.make()  # the shipped file is what the script makes
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert sp.get_piece_size() == CONFIG["gpt2_config"]["vocab_size"]
    assert [sp.id_to_piece(i) for i in range(4)] == ["<unk>", "<s>", "</s>", "<pad>"]
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    user = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    assert [proto.pieces[i].type for i in range(4, 10)] == [user] * 6
    assert [proto.pieces[i].piece for i in range(4, 10)] == list(make.CONTROL)
    assert proto.trainer_spec.byte_fallback and proto.normalizer_spec.name == "nmt_nfkc"
    assert proto.trainer_spec.model_type == proto.trainer_spec.BPE
    text = "Hi 🙂 语音 <|audio_start|>"
    ids = sp.encode(text)
    assert sp.decode(ids) == text and 6 in ids  # bytes fall back; a control token is one id
    assert sp.piece_to_id("<0xF0>") in ids


def test_the_codec_folder_opens_as_the_release(tmp_path, monkeypatch):
    monkeypatch.setenv("MOSS_GGUF_CACHE", str(tmp_path))
    codec = open_nano_codec(ensure_tiny_nano_codec_folder())
    assert (codec.sample_rate, codec.channels, codec.n_vq) == (48000, 2, 16)
