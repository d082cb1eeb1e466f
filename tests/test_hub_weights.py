"""From a Hub model to speech, offline: the default codec, pre-converted weights, look-alikes.

The tests build a Hugging Face cache as the hub client lays it out (blobs named by their
sha256 or git blob id, snapshot symlinks, refs/main, the recorded tree listing) and run the
real commands with HF_HUB_OFFLINE=1 and HF_HUB_CACHE pointing at it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from moss_gguf_cli.source.audio_tokenizer import DEFAULT_REPO
from moss_gguf_cli.source.hub import git_blob_id
from moss_gguf_cli.source.tiny_codec import write_tiny_codec

GGUF_REPO = "OpenMOSS-Team/MOSS-TTS-GGUF"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
LFS_SUFFIXES = (".gguf", ".npy", ".onnx", ".data")
PATH_KEYS = ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir")
ONNX_KEYS = ("audio_encoder_onnx", "audio_decoder_onnx")


def add_repo(cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """Put files (repo path → local file) into cache as repo_id at COMMIT; the repo folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    tree = {}
    for rel, src in files.items():
        lfs = rel.endswith(LFS_SUFFIXES)
        sha = hashlib.sha256(src.read_bytes()).hexdigest()
        blob_id = git_blob_id(src)
        name = sha if lfs else blob_id
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, repo / "blobs" / name)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / name, link.parent))
        entry = {"size": src.stat().st_size, "blob_id": blob_id}
        if lfs:
            entry.update(lfs_sha256=sha, lfs_size=src.stat().st_size)
        tree[rel] = entry
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "trees").mkdir(parents=True, exist_ok=True)
    (repo / "trees" / f"{COMMIT}.json").write_text(
        json.dumps({"format_version": 1, "files": tree})
    )
    return repo


def files_of(folder: Path, prefix: str = "") -> dict[str, Path]:
    return {
        prefix + p.relative_to(folder).as_posix(): p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def run(*args: str, cache: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args],
        capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="session")
def demo_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:tiny through `all`: the files a pre-converted repo is made of."""
    out = tmp_path_factory.mktemp("demo") / "w"
    done = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", "all", "--model", "builtin:tiny", "-q",
         "--output", str(out)], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="session")
def codec_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny codec saved with external data, as the ONNX repo holds it."""
    folder = tmp_path_factory.mktemp("codec")
    write_tiny_codec(folder, external_data=True)
    assert (folder / "decoder.onnx.data").is_file()
    return folder


@pytest.fixture(scope="session")
def hub(tmp_path_factory, demo_weights: Path, codec_files: Path) -> Path:
    """A Hub cache with the pre-converted repo and the codec repo."""
    cache = tmp_path_factory.mktemp("hub")
    gguf = {"MOSS_TTS_Q4_K_M.gguf": demo_weights / "backbone_q4_k_m.gguf"}
    tables = {}
    for sub in ("embeddings", "lm_heads", "tokenizer"):
        tables.update(files_of(demo_weights / sub, f"{sub}/"))
    readme = tmp_path_factory.mktemp("readme") / "README.md"
    readme.write_text("# MOSS-TTS-GGUF\n")
    add_repo(cache, GGUF_REPO, {**gguf, **tables, "README.md": readme})
    add_repo(cache, DEFAULT_REPO, files_of(codec_files))
    return cache


def assert_speaks(config: Path, cache: Path, tmp_path: Path) -> None:
    """Every path of the YAML resolves (as upstream's PipelineConfig checks), and synth speaks."""
    data = yaml.safe_load(config.read_text())
    for key in PATH_KEYS + ONNX_KEYS:
        assert data[key], key
        assert (config.parent / data[key]).exists(), (key, data[key])
    wav = tmp_path / "out.wav"
    done = run("synth", "--config", str(config), "--text", "Hello", "--max-new-tokens", "120",
               "--seed", "1", "--output", str(wav), cache=cache)  # fmt: skip
    assert done.returncode == 0, done.stderr
    audio, rate = sf.read(wav)
    assert rate == 24000 and audio.size > 0 and np.isfinite(audio).all()


# ----------------------------------------------------------------------------- the default codec


def test_real_checkpoint_gets_the_default_codec_from_the_hub(
    tiny_model: Path, hub: Path, tmp_path: Path
) -> None:
    out = tmp_path / "w"
    # a folder, not builtin:tiny: the model's own codec, from the (offline) Hub cache
    done = run("all", "--model", str(tiny_model), "--output", str(out), "-q", cache=hub)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["audio_tokenizer"] == DEFAULT_REPO
    codec = {p.name for p in (out / "audio_tokenizer").iterdir()}
    assert codec == {"encoder.onnx", "encoder.onnx.data", "decoder.onnx", "decoder.onnx.data"}
    blob = (hub / ("models--" + DEFAULT_REPO.replace("/", "--")) / "snapshots" / COMMIT
            / "decoder.onnx.data").resolve()  # fmt: skip
    assert (out / "audio_tokenizer/decoder.onnx.data").stat().st_ino == blob.stat().st_ino
    assert run("verify", str(out), cache=hub).returncode == 0
    assert_speaks(out / "moss-tts.yaml", hub, tmp_path)


def test_missing_codec_fails_before_any_conversion(tiny_model: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-hub"
    empty.mkdir()
    out = tmp_path / "w"
    started = time.monotonic()
    done = run("all", "--model", str(tiny_model), "--output", str(out), cache=empty)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert DEFAULT_REPO in line and "--audio-tokenizer" in line
    assert took < 10, took
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-hub"]  # nothing written


def test_wrong_codec_is_refused_before_conversion(
    tiny_model: Path, codec_files: Path, tmp_path: Path
) -> None:
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    for name in ("encoder.onnx", "encoder.onnx.data"):
        shutil.copyfile(codec_files / name, swapped / name)
    os.replace(swapped / "encoder.onnx", swapped / "decoder.onnx")  # an encoder posing
    done = run("all", "--model", str(tiny_model), "--output", str(tmp_path / "w"),
               "--audio-tokenizer", str(swapped), cache=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "wrong signature" in done.stderr, done.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / ".w.work").exists()


def test_no_codec_finishes_says_so_and_verify_fails_until_one_is_added(
    tiny_model: Path, hub: Path, codec_files: Path, tmp_path: Path
) -> None:
    out = tmp_path / "w"
    done = run("all", "--model", str(tiny_model), "--output", str(out),
               "--audio-tokenizer", "none", cache=hub)  # fmt: skip
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert "cannot speak yet" in last and "moss-gguf layout --output" in last
    check = run("verify", str(out), "--json", cache=hub)
    assert check.returncode == 1
    rows = {r["name"]: r for r in json.loads(check.stdout)["rows"]}
    assert rows["audio tokenizer"]["status"] == "fail"
    assert "audio_decoder_onnx is not set" in rows["audio tokenizer"]["detail"]
    # the one command the last line names, with the codec repo
    added = run("layout", "--output", str(out), "--audio-tokenizer", DEFAULT_REPO, cache=hub)
    assert added.returncode == 0, added.stderr
    assert run("verify", str(out), cache=hub).returncode == 0
    assert_speaks(out / "moss-tts.yaml", hub, tmp_path)


# ----------------------------------------------------------------------------- pre-converted


def test_preconverted_repo_from_the_cache_speaks(hub: Path, tmp_path: Path) -> None:
    out = tmp_path / "MOSS-TTS-GGUF"
    done = run("all", "--model", GGUF_REPO, "--output", str(out), cache=hub)
    assert done.returncode == 0, done.stderr
    assert "sha256 as the Hub lists" in done.stdout
    names = {p.name for p in out.iterdir()}
    assert {"MOSS_TTS_Q4_K_M.gguf", "embeddings", "lm_heads", "tokenizer", "audio_tokenizer",
            "moss-tts.yaml", "manifest.json", "extraction_meta.json"} == names  # fmt: skip
    meta = json.loads((out / "extraction_meta.json").read_text())
    assert meta["n_vq"] == 32 and meta["hidden_size"] == 256 and "derived" in meta
    check = run("verify", str(out), "--json", cache=hub)
    assert check.returncode == 0, check.stdout
    facts = {r["name"]: r for r in json.loads(check.stdout)["rows"]}["model facts"]
    assert "derived" in facts["detail"] and "emb_ext tables" in facts["detail"]
    assert_speaks(out / "moss-tts.yaml", hub, tmp_path)
    again = run("all", "--model", GGUF_REPO, "--output", str(out), cache=hub)
    assert again.returncode == 0 and "skipped" in again.stdout


def test_preconverted_local_copy(demo_weights: Path, codec_files: Path, tmp_path: Path) -> None:
    copy = tmp_path / "MOSS-TTS-GGUF"
    for sub in ("embeddings", "lm_heads", "tokenizer"):
        shutil.copytree(demo_weights / sub, copy / sub)
    shutil.copyfile(demo_weights / "backbone_q4_k_m.gguf", copy / "MOSS_TTS_Q4_K_M.gguf")
    out = tmp_path / "w"
    done = run("all", "--model", str(copy), "--output", str(out), "--audio-tokenizer",
               str(codec_files), cache=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert run("verify", str(out), cache=tmp_path).returncode == 0


@pytest.mark.parametrize("victim", ["embeddings/emb_ext_07.npy", "MOSS_TTS_Q4_K_M.gguf",
                                    "tokenizer/tokenizer_config.json"])  # fmt: skip
def test_one_changed_byte_is_a_sha_mismatch(hub: Path, victim: str, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    shutil.copytree(hub, cache, symlinks=True)
    blob = (cache / ("models--" + GGUF_REPO.replace("/", "--")) / "snapshots" / COMMIT
            / victim).resolve()  # fmt: skip
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    out = tmp_path / "w"
    done = run("all", "--model", GGUF_REPO, "--output", str(out), cache=cache)
    assert done.returncode != 0
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "sha256" in line and victim in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub"]  # no output folder


def test_a_quant_type_the_repo_lacks(hub: Path, tmp_path: Path) -> None:
    done = run("all", "--model", GGUF_REPO, "--output", str(tmp_path / "w"), "--quant", "Q8_0",
               cache=hub)  # fmt: skip
    assert done.returncode == 2
    assert "no Q8_0" in done.stderr and "it has Q4_K_M" in done.stderr
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------------------- look-alikes


def write_gguf(path: Path, arch: str, tensors: list[str]) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for name in tensors:
        w.add_tensor(name, np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: [write_gguf(d / "m.gguf", "qwen3", ["token_embd.weight"]),
                    write_gguf(d / "m.extras.gguf", "moss-extras", ["emb_ext.0"])],
         "extras.gguf pair"),
        (lambda d: [write_gguf(d / "MOSS_TTS_Q4_K_M.gguf", "moss-tts-delay",
                               ["token_embd.weight", "emb_ext.0.weight", "lm_heads.1.weight"])],
         "tables inside"),
        (lambda d: [write_gguf(d / "moss-tts.gguf", "moss-tts",
                               ["token_embd.weight", "codec.decoder.conv.weight"])],
         "bundling the audio codec"),
        (lambda d: [write_gguf(d / "local.gguf", "moss-tts-local",
                               ["local_transformer.layers.0.weight"])],
         "MOSS-TTS-Local"),
    ],
)  # fmt: skip
def test_look_alike_gguf_repos_are_refused(make, words: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    make(repo)
    done = run("all", "--model", str(repo), "--output", str(tmp_path / "w"), cache=tmp_path)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and words in line, line
    assert "llama.cpp-backend layout" in line
    assert not (tmp_path / "w").exists()
