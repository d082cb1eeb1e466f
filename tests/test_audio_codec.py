"""`convert --format moss-tts-audio-codec`: the fork's encoder and decoder GGUFs, byte for byte.

CI cannot run the fork's converter (its gguf-py and script are not installed here), so its
outputs are held as sha256 values, made from the checkpoints tests/tiny_audio_tokenizer.py
writes (REAL_LIKE into a folder named MOSS-Audio-Tokenizer-tiny, ODD into codec-odd):

  converter: convert_moss_audio_tokenizer_split_to_gguf.py (14855 bytes, sha256
             70d31a89eb83cd13923821fa4ecf9f7bef96e44b1ad9404fe2cfa313d3c45a5a) with its
             helpers convert_moss_audio_tokenizer_to_gguf.py (18220 bytes, sha256
             2087fa2daa5fb93c513e512663983f654dcc5c596cad50ca8efb778569ce57c4): OpenMOSS's
             llama.cpp fork, branch moss-tts-firstclass, as the public code index holds them
             (find "convert_moss_audio_tokenizer_split_to_gguf"), saved side by side
  gguf-py:   the fork's, from https://github.com/expectqwq/llama.cpp commit
             7d26f9138947778ff471e278eb5a148c70777633 (gguf-py/, version 0.18.0), beside them
  command:   python convert_moss_audio_tokenizer_split_to_gguf.py MODEL --outtype f16|f32
             --encoder-outfile MODEL_NAME-encoder-TYPE.gguf
             --decoder-outfile MODEL_NAME-decoder-TYPE.gguf
             (numpy 2.4.6; the checkpoints written with torch 2.13.0 and safetensors 0.8.0)

The fork's converter needs the index: on one model.safetensors its header reader keeps a
"__data_start__" entry that its tensor loop then reads as a tensor (TypeError). Ours reads a
one-file checkpoint in name order, the order of an index transformers writes, so the one-file
checkpoint gives the same bytes. A change to tiny_audio_tokenizer.py changes the values; they
are then made again with the command above.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from in_process import Ran, moss_gguf
from safetensors.torch import load_file, save_file
from tiny_audio_tokenizer import ODD, REAL_LIKE, write_codec

from moss_gguf_cli.disk.digests import sha256_file
from moss_gguf_cli.gguf.codec import REQUIRED_KEYS, fold_weight_norm
from moss_gguf_cli.pipeline.audio_codec import convert_codec
from moss_gguf_cli.source.checkpoint import TensorRef

NAMES = {"real": "MOSS-Audio-Tokenizer-tiny", "odd": "codec-odd"}
SPECS = {"real": REAL_LIKE, "odd": ODD}
GOLDEN = {
    ("real", "f16"): (
        "973d68b54ff500678a4f09d05112c96ed5993d4066ee79103aace2903b382e48",
        "f1ae2066b60fa0f7b9210fbe48da2ad35a3cdc35eb0abb22dbebfdc5a6d8fe68",
    ),
    ("real", "f32"): (
        "defef956d2fd49bb5c7c2ee067420ebfbeb20d9193efe04a3292d6ca49645c28",
        "22f0148808e616f8bad1c1ec101f3743f5a80cca34ff845b5c991d27e2351ea4",
    ),
    ("odd", "f16"): (
        "df76558005ac50e67ec508471943ae5ce438bcd3f4c2e8d1264db2509126437d",
        "22e37c1922e17445f9a0d0417753a965e30f7278bf669f65144339ec50c787b0",
    ),
    ("odd", "f32"): (
        "432e82d98abd332287386e9654c2ebb02c26f249a1fbc743c5085a8332e1ce10",
        "20ca3ba860743710190919197634c12ba3927b38e0b4ebb11835a4341fc5e761",
    ),
}


@pytest.fixture(scope="module")
def codecs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("codecs")
    return {k: write_codec(root / NAMES[k], SPECS[k]) for k in SPECS}


def moss(*args: str, env: dict | None = None) -> subprocess.CompletedProcess | Ran:
    """`moss-gguf ARGS` through the Typer app and its catch point (tests/in_process.py); with
    ENV (the Hub's variables, which huggingface_hub reads when it is imported) in a child."""
    if not env:
        return moss_gguf(*args)
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["real", "odd"])
@pytest.mark.parametrize("outtype", ["f16", "f32"])
def test_the_files_are_the_fork_converters(codecs, kind: str, outtype: str, tmp_path: Path):
    r = convert_codec(codecs[kind], tmp_path, outtype)
    name = NAMES[kind]
    assert r.encoder == tmp_path / f"{name}-encoder-{outtype}.gguf"
    assert r.decoder == tmp_path / f"{name}-decoder-{outtype}.gguf"
    assert (sha256_file(r.encoder), sha256_file(r.decoder)) == GOLDEN[(kind, outtype)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([r.encoder.name, r.decoder.name])


def test_the_command_writes_them(codecs, tmp_path: Path) -> None:
    out = tmp_path / "codec"
    done = moss("convert", str(codecs["odd"]), "--format", "moss-tts-audio-codec", "-o",
                str(out), "--outtype", "f32")  # fmt: skip
    assert done.returncode == 0, done.stderr
    enc, dec = (out / f"codec-odd-{p}-f32.gguf" for p in ("encoder", "decoder"))
    assert done.stdout.split() == [str(enc), str(dec)]
    assert (sha256_file(enc), sha256_file(dec)) == GOLDEN[("odd", "f32")]


def read(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(path)
    keys = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    return keys, {t.name: (t.tensor_type, np.array(t.data)) for t in r.tensors}


def test_the_header_is_what_the_forks_loader_reads(codecs, tmp_path: Path) -> None:
    r = convert_codec(codecs["real"], tmp_path, "f16")
    spec = REAL_LIKE
    for path, arch, modules in (
        (r.encoder, "moss-tts-audio-encoder", spec.encoder),
        (r.decoder, "moss-tts-audio-decoder", spec.decoder),
    ):
        keys, tensors = read(path)
        assert keys["general.architecture"] == arch
        assert keys["general.name"] == f"MOSS-Audio-Tokenizer-tiny {arch.split('-')[-1].title()}"
        got = {k: keys[f"{arch}.{k}"] for k in REQUIRED_KEYS}
        assert got == {"sampling_rate": 24000, "downsample_rate": 16,
                       "quantizer.num_quantizers": 3}  # fmt: skip
        assert keys[f"{arch}.{arch.split('-')[-1]}.block_count"] == len(modules)
        blocks = sum(m["module_type"] == "Transformer" for m in modules)
        assert {n.split(".")[1] for n in tensors if n.startswith("blk.")} == {
            str(b) for b in range(blocks)
        }
        for n in range(3):
            assert f"quantizer.quantizers.{n}.codebook.weight" in tensors
            assert (f"quantizer.quantizers.{n}.in_proj.weight" in tensors) == (
                arch.endswith("encoder")
            )
    # encoder: the first Transformer's context is 10 s at 24000/8 frames per second
    keys, _ = read(r.encoder)
    assert keys["moss-tts-audio-encoder.encoder.1.context"] == 30000


def test_weight_norm_is_folded(codecs, tmp_path: Path) -> None:
    r = convert_codec(codecs["real"], tmp_path, "f32")
    _, tensors = read(r.encoder)
    src = load_file(str(codecs["real"] / "model-00002-of-00002.safetensors"))
    src.update(load_file(str(codecs["real"] / "model-00001-of-00002.safetensors")))
    g = src["quantizer.input_proj.parametrizations.weight.original0"].numpy()
    v = src["quantizer.input_proj.parametrizations.weight.original1"].numpy()
    qtype, data = tensors["quantizer.input_proj.weight"]
    assert qtype == gguf.GGMLQuantizationType.F32
    np.testing.assert_array_equal(data.reshape(v.shape), fold_weight_norm(g, v))
    # each output row has the norm g
    np.testing.assert_allclose(np.linalg.norm(data.reshape(v.shape), axis=(1, 2)),
                               g.reshape(-1), rtol=1e-5)  # fmt: skip


def test_each_tensor_is_read_once(codecs, tmp_path: Path, monkeypatch) -> None:
    reads: list[str] = []
    original = TensorRef.read_f32

    def counted(self, *a, **k):
        reads.append(self.name)
        return original(self, *a, **k)

    monkeypatch.setattr(TensorRef, "read_f32", counted)
    convert_codec(codecs["real"], tmp_path, "f16")
    assert len(reads) == len(set(reads))
    # every quantizer's codebook is in both files, read once
    assert reads.count("quantizer.quantizers.0.codebook.weight") == 1


def test_one_file_gives_the_same_files(codecs, tmp_path: Path) -> None:
    one = write_codec(tmp_path / "one" / NAMES["real"], dataclasses.replace(REAL_LIKE, index=False))
    assert [p.name for p in one.glob("*.safetensors")] == ["model.safetensors"]
    assert not (one / "model.safetensors.index.json").exists()
    r = convert_codec(one, tmp_path / "out", "f16")
    assert (sha256_file(r.encoder), sha256_file(r.decoder)) == GOLDEN[("real", "f16")]


def refused(done: subprocess.CompletedProcess, out: Path, *words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def convert_cli(model: Path, out: Path) -> subprocess.CompletedProcess:
    return moss("convert", str(model), "--format", "moss-tts-audio-codec", "-o", str(out))


def rewrite_shard(folder: Path, name: str, change) -> None:
    """Rewrite the shard holding NAME after CHANGE(its tensors); the index follows."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    change(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["weight_map"] = {
        k: v for k, v in index["weight_map"].items() if v != shard.name or k in tensors
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_a_missing_tensor_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    folder = write_codec(tmp_path / "m", REAL_LIKE)
    gone = "decoder.2.transformer.layers.1.linear1.weight"
    rewrite_shard(folder, gone, lambda t: t.pop(gone))
    refused(convert_cli(folder, tmp_path / "out"), tmp_path / "out", gone, "missing")


def test_a_mis_shaped_tensor_is_named(tmp_path: Path) -> None:
    folder = write_codec(tmp_path / "m", REAL_LIKE)
    name = "quantizer.quantizers.0.codebook.weight"
    rewrite_shard(folder, name, lambda t: t.update({name: t[name][:-1].clone()}))
    refused(convert_cli(folder, tmp_path / "out"), tmp_path / "out", name, "[15, 4]", "[16, 4]")


def test_a_moss_tts_checkpoint_is_not_a_codec(tiny_model: Path, tmp_path: Path) -> None:
    refused(convert_cli(tiny_model, tmp_path / "out"), tmp_path / "out",
            "not a MOSS Audio Tokenizer", str(tiny_model / "config.json"))  # fmt: skip


def test_an_unknown_module_type_is_named(tmp_path: Path) -> None:
    folder = write_codec(tmp_path / "m", ODD)
    config = json.loads((folder / "config.json").read_text())
    config["encoder_kwargs"].append({"module_type": "Conv", "kernel_size": 3})
    (folder / "config.json").write_text(json.dumps(config))
    refused(convert_cli(folder, tmp_path / "out"), tmp_path / "out",
            "encoder_kwargs[2].module_type 'Conv'")  # fmt: skip


def test_other_out_types_are_refused(codecs, tmp_path: Path) -> None:
    done = moss("convert", str(codecs["odd"]), "--format", "moss-tts-audio-codec", "-o",
                str(tmp_path / "out"), "--outtype", "q8_0")  # fmt: skip
    refused(done, tmp_path / "out", "f16 or f32")


def test_a_hub_repo_is_named_by_the_repo_not_the_snapshot(codecs, tmp_path: Path) -> None:
    from test_hub_weights import add_repo, files_of

    cache = tmp_path / "hub"
    add_repo(cache, "OpenMOSS-Team/MOSS-Audio-Tokenizer", files_of(codecs["odd"]))
    out = tmp_path / "out"
    done = moss("convert", "OpenMOSS-Team/MOSS-Audio-Tokenizer", "--format",
                "moss-tts-audio-codec", "-o", str(out),
                env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == [f"MOSS-Audio-Tokenizer-{p}-f16.gguf" for p in ("decoder", "encoder")]
    keys, _ = read(out / files[1])
    assert keys["general.name"] == "MOSS-Audio-Tokenizer Encoder"


@pytest.mark.parametrize("kind", ["real", "odd"])
def test_sizes_from_the_config_are_the_files(codecs, kind: str, tmp_path: Path) -> None:
    """The figures docs/audio-codec.md gives for the real tokenizer come from part_sizes."""
    from moss_gguf_cli.source.codec_plan import part_sizes

    sizes = part_sizes(SPECS[kind].config())
    for outtype in ("f16", "f32"):
        r = convert_codec(codecs[kind], tmp_path / outtype, outtype)
        for part, path in (("encoder", r.encoder), ("decoder", r.decoder)):
            tensors = gguf.GGUFReader(path).tensors
            assert len(tensors) == sizes[part].tensors
            assert sum(int(t.n_elements) for t in tensors) == sizes[part].params
            want = sizes[part].f16_bytes if outtype == "f16" else sizes[part].f32_bytes
            assert sum(int(t.n_bytes) for t in tensors) == want


def test_verify_checks_one_codec_file(codecs, tmp_path: Path) -> None:
    r = convert_codec(codecs["odd"], tmp_path / "out", "f16")
    shown = moss("verify", str(r.decoder), "--json")
    assert shown.returncode == 0, shown.stdout
    report = json.loads(shown.stdout)
    assert report["kind"] == "codec" and report["ok"]
    with open(r.encoder, "r+b") as f:  # the last tensor's data cut short
        f.truncate(f.seek(0, 2) - 16)
    shown = moss("verify", str(r.encoder), "--json")
    assert shown.returncode != 0
    assert "ends past the end of the file" in shown.stdout
