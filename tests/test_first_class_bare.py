"""A first-class GGUF alone in a folder (no tokenizer/ beside it) reads back and speaks.

The files are the fork's own output for builtin:tiny, F16 and Q8_0 (their sha256 are the golden
values tests/test_delay_gguf.py holds, made with the fork). `all --model FILE` rebuilds the text
tokenizer from the file's tokenizer.ggml.* keys (gguf/tokenizer_files.py, the tokenizers
library: no transformers, no torch): the ids are the checkpoint tokenizer's on every test text,
the backbone GGUF is byte for byte the one made with the checkpoint's tokenizer files beside
the file, and synth speaks the same greedy audio. scripts/check-installs.sh runs the same path
in an environment where torch is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
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
    "<think>\nplain added tokens</think><tool_call>{}</tool_call> <|fim_prefix|>",
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


@pytest.fixture(scope="module")
def bare_q8_0(tiny_first_class: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fork's Q8_0 first-class file for builtin:tiny (from the run's shared `all`), alone in
    a folder."""
    made = tiny_first_class
    path = tmp_path_factory.mktemp("bare-q8_0") / "moss-tts-delay_q8_0.gguf"
    shutil.copy(made / path.name, path)
    assert sha256_file(path) == GOLDEN["tiny"]["Q8_0"]
    return path


def rebuilt(gguf: Path, folder: Path) -> Tokenizer:
    """write_tokenizer_files in a process of its own, which must load neither transformers
    nor torch."""
    code = ("import sys\nfrom pathlib import Path\n"
            "from moss_gguf_cli.gguf.tokenizer_files import write_tokenizer_files\n"
            f"write_tokenizer_files(Path({str(gguf)!r}), Path({str(folder)!r}))\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))"
            )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
    assert sorted(p.name for p in folder.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def assert_same_ids(ours: Tokenizer, theirs: Tokenizer) -> None:
    for text in TEXTS:
        want = theirs.encode(text).ids
        assert ours.encode(text).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == theirs.decode(
            want, skip_special_tokens=False
        )
    assert ours.get_vocab() == theirs.get_vocab()  # no [PADn] rows: the header pads them


@pytest.mark.parametrize("file_type", ["F16", "Q8_0"])
def test_the_rebuilt_tokenizer_gives_the_checkpoints_ids(
    file_type: str, bare: Path, bare_q8_0: Path, tiny_model: Path, tmp_path: Path
) -> None:
    gguf = bare if file_type == "F16" else bare_q8_0
    ours = rebuilt(gguf, tmp_path / "tokenizer")
    assert_same_ids(ours, Tokenizer.from_file(str(tiny_model / "tokenizer.json")))
    config = json.loads((tmp_path / "tokenizer" / "tokenizer_config.json").read_text())
    theirs = json.loads((tiny_model / "tokenizer_config.json").read_text())
    for key in ("eos_token", "pad_token", "bos_token", "chat_template", "add_bos_token"):
        assert config[key] == theirs[key], key
    special = {i for i, t in config["added_tokens_decoder"].items() if t["special"]}
    assert {"151643", "151644", "151645"} <= special  # <|endoftext|>, <|im_start|>, <|im_end|>
    assert not config["added_tokens_decoder"]["151667"]["special"]  # <think>: a plain one


def test_the_laid_out_folder_says_the_tokenizer_was_rebuilt(from_bare: Path, tiny_model: Path):
    ours = Tokenizer.from_file(str(from_bare / "tokenizer" / "tokenizer.json"))
    assert_same_ids(ours, Tokenizer.from_file(str(tiny_model / "tokenizer.json")))
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
