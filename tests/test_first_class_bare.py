"""A first-class GGUF alone in a folder (no tokenizer/ beside it) reads back and speaks.

The file is the fork converter's own output for builtin:tiny (its sha256 is the golden value
tests/test_delay_gguf.py holds, made with the fork). `all --model FILE` rebuilds the text
tokenizer from the file's tokenizer.ggml.* keys (gguf/tokenizer_files.py): the ids are the
checkpoint tokenizer's on every test text, the backbone GGUF is byte for byte the one made
with the checkpoint's tokenizer files beside the file, and synth speaks the same greedy audio.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_speak_alike
from test_delay_gguf import GOLDEN, cli
from tokenizers import Tokenizer

from moss_gguf_cli.disk.digests import sha256_file
from moss_gguf_cli.source.tiny_codec import write_tiny_codec

TEXTS = [
    "Hello, world! It's 12:30 — 3.14159…",
    "你好，世界。今天天气不错，我们去公园散步吧！",
    "<|im_start|>user\nRound trip, please.<|im_end|>\n<|im_start|>assistant\n",
    "  two spaces,\n\nnew lines\tand tabs; ÄÖÜ ß émoji 😀 Ｆｕｌｌ width ①",
    "Cafe\u0301 and n\u0303: decomposed accents the NFC normalizer composes",
    "<|endoftext|>",
]


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_codec(tmp_path_factory.mktemp("codec"))[0].parent


@pytest.fixture(scope="module")
def bare(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fork's first-class file for builtin:tiny, alone in a folder."""
    folder = tmp_path_factory.mktemp("bare")
    path = folder / "moss-tts-delay_f16.gguf"
    done = cli("convert", "builtin:tiny", "--format", "moss-tts-delay", "-o", str(path), "-q")
    assert done.returncode == 0, done.stderr
    assert sha256_file(path) == GOLDEN["tiny"]["F16"]  # the fork converter's bytes
    assert [p.name for p in folder.iterdir()] == [path.name]
    return path


def laid_out(model: Path, out: Path, codec: Path) -> Path:
    done = cli("all", "--model", str(model), "--quant", "F16", "--output", str(out),
               "--audio-tokenizer", str(codec), "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def from_bare(bare: Path, codec: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return laid_out(bare, tmp_path_factory.mktemp("from-bare") / "w", codec)


def test_the_rebuilt_tokenizer_gives_the_checkpoints_ids(from_bare: Path, tiny_model: Path):
    ours = Tokenizer.from_file(str(from_bare / "tokenizer" / "tokenizer.json"))
    theirs = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    for text in TEXTS:
        want = theirs.encode(text).ids
        assert ours.encode(text).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == theirs.decode(
            want, skip_special_tokens=False
        )
    assert ours.get_vocab() == theirs.get_vocab()  # no [PADn] rows: the header pads them
    meta = json.loads((from_bare / "extraction_meta.json").read_text())
    assert meta["first_class"]["tokenizer"].startswith("rebuilt from the GGUF")
    shown = cli("verify", str(from_bare))
    assert shown.returncode == 0, shown.stdout


def test_it_speaks_as_with_the_checkpoints_tokenizer_beside_it(
    from_bare: Path, bare: Path, tiny_model: Path, codec: Path, tmp_path: Path
) -> None:
    beside = tmp_path / "beside"
    (beside / "tokenizer").mkdir(parents=True)
    shutil.copy(bare, beside / bare.name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, beside / "tokenizer" / name)
    with_tokenizer = laid_out(beside / bare.name, tmp_path / "w", codec)
    assert sha256_file(from_bare / "backbone_f16.gguf") == sha256_file(
        with_tokenizer / "backbone_f16.gguf"
    )
    assert_speak_alike((with_tokenizer, from_bare), "Read back, alone. 你好！")
