"""`all --format moss-tts-delay --pytorch-audio-tokenizer`: the codec GGUFs in the first-class
folder, recorded in its manifest, named in its README's native command line, checked by verify.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_audio_codec import GOLDEN, NAMES
from test_delay_gguf import cli
from tiny_audio_tokenizer import REAL_LIKE, write_codec

from moss_gguf_cli.disk.digests import sha256_file
from moss_gguf_cli.errors import InputError
from moss_gguf_cli.gguf.codec_read import check_codec
from moss_gguf_cli.pipeline.audio_codec import write_codecs
from moss_gguf_cli.source.audio_tokenizer_checkpoint import open_codec_checkpoint
from moss_gguf_cli.source.codec_plan import plan_codecs

ENC, DEC = (f"MOSS-Audio-Tokenizer-tiny-{p}-f16.gguf" for p in ("encoder", "decoder"))


@pytest.fixture(scope="module")
def codec(tmp_path_factory) -> Path:
    return write_codec(tmp_path_factory.mktemp("ck") / NAMES["real"], REAL_LIKE)


@pytest.fixture(scope="module")
def folder(codec: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fc") / "w"
    done = cli(
        "all",
        "--model",
        "builtin:tiny",
        "--output",
        str(out),
        "--format",
        "moss-tts-delay",
        "--quant",
        "F16",
        "--pytorch-audio-tokenizer",
        str(codec),
        "-q",
    )
    assert done.returncode == 0, done.stderr
    return out


def test_the_folder_holds_the_forks_codec_files(folder: Path, codec: Path) -> None:
    assert (sha256_file(folder / ENC), sha256_file(folder / DEC)) == GOLDEN[("real", "f16")]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["native_audio_codec"] == {
        "source": str(codec),
        "outtype": "f16",
        "encoder": ENC,
        "decoder": DEC,
    }
    listed = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert listed[ENC] == GOLDEN[("real", "f16")][0]
    readme = (folder / "README.md").read_text()
    assert f"--audio-encoder-model {ENC} --audio-decoder-model {DEC}" in readme
    assert "llama-moss-tts -m moss-tts-delay_f16.gguf" in readme


def test_verify_checks_them(folder: Path, tmp_path: Path) -> None:
    shown = cli("verify", str(folder))
    assert shown.returncode == 0, shown.stdout
    assert f"{ENC}: codec header" in shown.stdout and "codec encoder vs decoder" in shown.stdout
    broken = tmp_path / "w"
    shutil.copytree(folder, broken)
    with open(broken / DEC, "r+b") as f:  # cut the last tensor's data short
        f.truncate(f.seek(0, 2) - 64)
    shown = cli("verify", str(broken))
    assert shown.returncode != 0
    assert "ends past the end of the file" in shown.stdout and DEC in shown.stdout


def test_a_missing_required_key_is_named(codec: Path, tmp_path: Path) -> None:
    ck = open_codec_checkpoint(codec)
    enc, dec = plan_codecs(ck, "f16")
    enc.keys = [k for k in enc.keys if not k[0].endswith(".downsample_rate")]
    write_codecs(ck, (enc, dec), (tmp_path / "e.gguf", tmp_path / "d.gguf"))
    check_codec(tmp_path / "d.gguf", "decoder")
    with pytest.raises(InputError, match="moss-tts-audio-encoder.downsample_rate is missing"):
        check_codec(tmp_path / "e.gguf", "encoder")
    with pytest.raises(InputError, match="architecture is 'moss-tts-audio-decoder'"):
        check_codec(tmp_path / "d.gguf", "encoder")


def test_the_option_needs_the_first_class_format(codec: Path, tmp_path: Path) -> None:
    done = cli("all", "--model", "builtin:tiny", "--output", str(tmp_path / "w"),
               "--pytorch-audio-tokenizer", str(codec))  # fmt: skip
    assert done.returncode == 2 and "--format moss-tts-delay" in done.stderr
    assert not (tmp_path / "w").exists()


def test_a_wrong_tokenizer_fails_before_any_work(tiny_model: Path, tmp_path: Path) -> None:
    done = cli(
        "all",
        "--model",
        "builtin:tiny",
        "--output",
        str(tmp_path / "w"),
        "--format",
        "moss-tts-delay",
        "--quant",
        "F16",
        "--pytorch-audio-tokenizer",
        str(tiny_model),
    )
    assert done.returncode == 2, done.stderr
    assert "not a MOSS Audio Tokenizer" in done.stderr and len(done.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []
