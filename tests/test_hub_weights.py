"""From a Hub model to speech, offline: the default codec, pre-converted weights, look-alikes.

The tests build a Hugging Face cache with the hub client's own writers (blobs named by their
sha256 or git blob id, its symlink writer, refs/main, its tree-listing writer with every LFS
file listed by its pointer's blob id, as the Hub's /tree endpoint reports it), an older
client's cache (no listing) and a `--local-dir` download (the client's metadata writer), and
run the real commands with HF_HUB_OFFLINE=1 and HF_HUB_CACHE pointing at it.
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
from huggingface_hub._local_folder import write_download_metadata
from huggingface_hub._tree_cache import (
    TreeCacheEntry,
    tree_cache_folder_for_local_dir,
    write_tree_cache,
)
from huggingface_hub.file_download import _create_symlink, repo_folder_name

from moss_gguf_cli.source.audio_tokenizer import DEFAULT_REPO
from moss_gguf_cli.source.tiny_codec import write_tiny_codec

GGUF_REPO = "OpenMOSS-Team/MOSS-TTS-GGUF"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
LFS_SUFFIXES = (".gguf", ".npy", ".onnx", ".data")
PATH_KEYS = ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir")
ONNX_KEYS = ("audio_encoder_onnx", "audio_decoder_onnx")


def git_hash(data: bytes) -> str:
    """The git blob id git itself gives DATA (what the Hub lists as blob_id)."""
    done = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True,
                          check=True)  # fmt: skip
    return done.stdout.decode().strip()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """A git-lfs pointer file, as the LFS spec (v1) writes it and git stores it."""
    spec = "https://git-lfs.github.com/spec/v1"
    return f"version {spec}\noid sha256:{sha256}\nsize {size}\n".encode()


def tree_entry(src: Path, rel: str) -> TreeCacheEntry:
    """The Hub's /tree entry for a file: an LFS file listed by its pointer's blob id."""
    data = src.read_bytes()
    if not rel.endswith(LFS_SUFFIXES):
        return TreeCacheEntry(size=len(data), blob_id=git_hash(data))
    sha = hashlib.sha256(data).hexdigest()
    return TreeCacheEntry(size=len(data), blob_id=git_hash(lfs_pointer(sha, len(data))),
                          lfs_sha256=sha, lfs_size=len(data))  # fmt: skip


def etag(src: Path, rel: str) -> str:
    """The etag the hub client stores: sha256 for an LFS file, the git blob id otherwise."""
    data = src.read_bytes()
    return hashlib.sha256(data).hexdigest() if rel.endswith(LFS_SUFFIXES) else git_hash(data)


def add_repo(
    cache: Path, repo_id: str, files: dict[str, Path], tree_listing: bool = True
) -> Path:
    """Put files (repo path → local file) into cache as repo_id at COMMIT, as huggingface_hub
    lays a cache out (its own symlink and tree-listing writers); the snapshot folder.
    tree_listing=False: an older client's cache, with no trees/ listing."""
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snap = repo / "snapshots" / COMMIT
    tree = {}
    for rel, src in files.items():
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        blob = repo / "blobs" / etag(src, rel)
        shutil.copyfile(src, blob)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(snap / rel))
        tree[rel] = tree_entry(src, rel)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    if tree_listing:
        write_tree_cache(str(repo), COMMIT, tree)
    return snap


def add_local_dir(folder: Path, files: dict[str, Path]) -> Path:
    """What `hf download REPO --local-dir FOLDER` leaves: the files, and per file the client's
    download metadata (commit, etag) and its tree listing under .cache/huggingface/."""
    for rel, src in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, folder / rel)
        write_download_metadata(folder, rel, COMMIT, etag(src, rel))
    tree = {rel: tree_entry(src, rel) for rel, src in files.items()}
    write_tree_cache(tree_cache_folder_for_local_dir(str(folder)), COMMIT, tree)
    return folder


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
def demo_weights(builds) -> Path:
    """builtin:tiny through `all` (the run's shared build): the files a pre-converted repo is
    made of."""
    return builds.all("--model", "builtin:tiny").path


@pytest.fixture(scope="session")
def codec_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny codec saved with external data, as the ONNX repo holds it."""
    folder = tmp_path_factory.mktemp("codec")
    write_tiny_codec(folder, external_data=True)
    assert (folder / "decoder.onnx.data").is_file()
    return folder


@pytest.fixture(scope="session")
def gguf_repo_files(tmp_path_factory, demo_weights: Path) -> dict[str, Path]:
    """The files of OpenMOSS-Team/MOSS-TTS-GGUF (repo path → file), made from builtin:tiny."""
    files = {"MOSS_TTS_Q4_K_M.gguf": demo_weights / "backbone_q4_k_m.gguf"}
    for sub in ("embeddings", "lm_heads", "tokenizer"):
        files.update(files_of(demo_weights / sub, f"{sub}/"))
    readme = tmp_path_factory.mktemp("readme") / "README.md"
    readme.write_text("# MOSS-TTS-GGUF\n")
    return {**files, "README.md": readme}


@pytest.fixture(scope="session")
def hub(tmp_path_factory, gguf_repo_files: dict[str, Path], codec_files: Path) -> Path:
    """A Hub cache with the pre-converted repo and the codec repo."""
    cache = tmp_path_factory.mktemp("hub")
    add_repo(cache, GGUF_REPO, gguf_repo_files)
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
    assert "against the hub client's tree listing" in done.stdout
    names = {p.name for p in out.iterdir()}
    assert {"MOSS_TTS_Q4_K_M.gguf", "embeddings", "lm_heads", "tokenizer", "audio_tokenizer",
            "moss-tts.yaml", "manifest.json", "extraction_meta.json",
            "README.md"} == names  # the model card (#51)  # fmt: skip
    meta = json.loads((out / "extraction_meta.json").read_text())
    assert meta["n_vq"] == 32 and meta["hidden_size"] == 256 and "derived" in meta
    check = run("verify", str(out), "--json", cache=hub)
    assert check.returncode == 0, check.stdout
    facts = {r["name"]: r for r in json.loads(check.stdout)["rows"]}["model facts"]
    assert "derived" in facts["detail"] and "emb_ext tables" in facts["detail"]
    assert_speaks(out / "moss-tts.yaml", hub, tmp_path)
    again = run("all", "--model", GGUF_REPO, "--output", str(out), cache=hub)
    assert again.returncode == 0 and "skipped" in again.stdout


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("victim", ["embeddings/emb_ext_07.npy", "MOSS_TTS_Q4_K_M.gguf",
                                    "tokenizer/tokenizer_config.json"])  # fmt: skip
def test_one_changed_byte_is_a_sha_mismatch(hub: Path, victim: str, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    shutil.copytree(hub, cache, symlinks=True)
    flip_a_byte((cache / repo_folder_name(repo_id=GGUF_REPO, repo_type="model") / "snapshots"
                 / COMMIT / victim).resolve())  # fmt: skip
    out = tmp_path / "w"
    done = run("all", "--model", GGUF_REPO, "--output", str(out), cache=cache)
    assert done.returncode != 0
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "sha256" in line and victim in line, line
    # what was expected and found, and the one command that fetches only that file again
    assert "where the record says" in line and "Traceback" not in line
    assert f"hf download {GGUF_REPO} {victim} --revision {COMMIT} --force-download" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub"]  # no output folder


# every way a user can hold the download, each checked against its own record
LAYOUTS = ("tree listing", "older cache", "local dir", "snapshot folder")


def hold_download(layout: str, place: Path, files: dict[str, Path], codec: Path) -> tuple:
    """The pre-converted repo (and the codec repo) held as LAYOUT under PLACE:
    (--model value, Hub cache, the file that stands for REL)."""
    cache = place / "hub"
    cache.mkdir(parents=True)
    if layout == "local dir":
        folder = add_local_dir(place / "MOSS-TTS-GGUF", files)
        add_repo(cache, DEFAULT_REPO, files_of(codec))
        return str(folder), cache, lambda rel: folder / rel
    listing = layout != "older cache"
    snap = add_repo(cache, GGUF_REPO, files, tree_listing=listing)
    add_repo(cache, DEFAULT_REPO, files_of(codec), tree_listing=listing)
    model = str(snap) if layout == "snapshot folder" else GGUF_REPO  # a path into the cache
    return model, cache, lambda rel: (snap / rel).resolve()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_of_a_genuine_download_speaks(
    layout: str, gguf_repo_files: dict[str, Path], codec_files: Path, tmp_path: Path
) -> None:
    model, cache, _ = hold_download(layout, tmp_path / "in", gguf_repo_files, codec_files)
    out = tmp_path / "w"
    done = run("all", "--model", model, "--output", str(out), cache=cache)
    assert done.returncode == 0, done.stderr
    record = {"tree listing": "tree listing", "older cache": "blob names",
              "local dir": "--local-dir download metadata",
              "snapshot folder": "tree listing"}[layout]  # fmt: skip
    assert record in done.stdout, done.stdout
    checks = json.loads((out / "manifest.json").read_text())["checks"]
    assert record in checks["source"] and checks["source"].startswith("sha256 of ")
    assert record in checks["audio_tokenizer"] or layout == "local dir"
    report = run("verify", str(out), "--json", cache=cache)
    assert report.returncode == 0, report.stdout
    rows = {r["name"]: r for r in json.loads(report.stdout)["rows"]}
    assert rows["source download"]["status"] == "pass"
    assert rows["audio tokenizer download"]["status"] == "pass"
    assert record in rows["source download"]["detail"]
    assert_speaks(out / "moss-tts.yaml", cache, tmp_path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_of_a_tampered_download_is_refused(
    layout: str, gguf_repo_files: dict[str, Path], codec_files: Path, tmp_path: Path
) -> None:
    victim = "MOSS_TTS_Q4_K_M.gguf"
    model, cache, where = hold_download(layout, tmp_path / "in", gguf_repo_files, codec_files)
    flip_a_byte(where(victim))
    out = tmp_path / "w"
    done = run("all", "--model", model, "--output", str(out), cache=cache)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert victim in line and "sha256" in line and "--force-download" in line, line
    assert not out.exists() and not (tmp_path / ".w.work").exists()


def test_a_plain_local_copy_is_used_as_it_is_and_says_so(
    demo_weights: Path, codec_files: Path, tmp_path: Path
) -> None:
    copy = local_preconverted(demo_weights, tmp_path / "MOSS-TTS-GGUF")
    out = tmp_path / "w"
    done = run("all", "--model", str(copy), "--output", str(out), "--audio-tokenizer",
               str(codec_files), cache=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = run("verify", str(out), "--json", cache=tmp_path)
    assert report.returncode == 0, report.stdout
    rows = {r["name"]: r for r in json.loads(report.stdout)["rows"]}
    assert rows["source download"]["status"] == "warn"
    assert rows["source download"]["detail"] == "not checked: no hub record"


def test_the_hub_client_lists_lfs_files_by_their_pointer_id(
    gguf_repo_files: dict[str, Path], tmp_path: Path
) -> None:
    """What moss-gguf relies on from get_cached_repo_tree: an LFS file comes back with the blob
    id of its pointer and no sha256. Should a huggingface_hub release change that, this fails
    and hub.mismatch must be looked at again."""
    from huggingface_hub import get_cached_repo_tree

    add_repo(tmp_path, GGUF_REPO, gguf_repo_files)
    listed = {f.path: f for f in get_cached_repo_tree(GGUF_REPO, cache_dir=tmp_path)}
    gguf = gguf_repo_files["MOSS_TTS_Q4_K_M.gguf"]
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    entry = listed["MOSS_TTS_Q4_K_M.gguf"]
    assert entry.blob_id == git_hash(lfs_pointer(sha, gguf.stat().st_size))
    assert entry.blob_id != git_hash(gguf.read_bytes())
    assert getattr(entry, "lfs", None) is None
    small = "tokenizer/tokenizer_config.json"
    assert listed[small].blob_id == git_hash(gguf_repo_files[small].read_bytes())


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


# ----------------------------------------------------------------------------- untrusted folders


def local_preconverted(demo_weights: Path, folder: Path) -> Path:
    for sub in ("embeddings", "lm_heads", "tokenizer"):
        shutil.copytree(demo_weights / sub, folder / sub)
    shutil.copyfile(demo_weights / "backbone_q4_k_m.gguf", folder / "MOSS_TTS_Q4_K_M.gguf")
    return folder


def assert_refused(done: subprocess.CompletedProcess, names: str, tmp_path: Path, keep: set):
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert names in line, line
    assert {p.name for p in tmp_path.iterdir()} == keep  # no output, no work folder


def test_a_link_out_of_a_preconverted_folder_is_refused(
    demo_weights: Path, codec_files: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours\n")
    copy = local_preconverted(demo_weights, tmp_path / "MOSS-TTS-GGUF")
    (copy / "tokenizer/merges.txt").unlink(missing_ok=True)
    (copy / "tokenizer/merges.txt").symlink_to(secret)
    done = run("all", "--model", str(copy), "--output", str(tmp_path / "w"),
               "--audio-tokenizer", str(codec_files), cache=tmp_path)  # fmt: skip
    assert_refused(done, "merges.txt", tmp_path, {"secret.txt", "MOSS-TTS-GGUF"})
    assert "outside the folder" in done.stderr
    assert secret.stat().st_nlink == 1  # never linked anywhere


def test_a_link_out_of_a_checkpoint_folder_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    copy = tmp_path / "model"
    shutil.copytree(tiny_model, copy)
    shard = sorted(copy.glob("*.safetensors"))[0]
    shutil.move(shard, outside / shard.name)
    shard.symlink_to(outside / shard.name)
    done = run("all", "--model", str(copy), "--output", str(tmp_path / "w"),
               "--audio-tokenizer", "none", cache=tmp_path)  # fmt: skip
    assert_refused(done, shard.name, tmp_path, {"elsewhere", "model"})


def test_a_pickled_table_is_refused_by_name(
    demo_weights: Path, codec_files: Path, tmp_path: Path
) -> None:
    copy = local_preconverted(demo_weights, tmp_path / "MOSS-TTS-GGUF")
    victim = copy / "lm_heads/lm_head_audio_03.npy"
    np.save(victim, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    done = run("all", "--model", str(copy), "--output", str(tmp_path / "w"),
               "--audio-tokenizer", str(codec_files), cache=tmp_path)  # fmt: skip
    assert_refused(done, "lm_head_audio_03.npy", tmp_path, {"MOSS-TTS-GGUF"})
    assert "object" in done.stderr and "never loaded" in done.stderr


def test_a_table_of_the_wrong_shape_is_refused_by_name(
    demo_weights: Path, codec_files: Path, tmp_path: Path
) -> None:
    copy = local_preconverted(demo_weights, tmp_path / "MOSS-TTS-GGUF")
    np.save(copy / "embeddings/emb_ext_05.npy", np.zeros((1025, 128), dtype=np.float16))
    done = run("all", "--model", str(copy), "--output", str(tmp_path / "w"),
               "--audio-tokenizer", str(codec_files), cache=tmp_path)  # fmt: skip
    assert_refused(done, "emb_ext_05.npy", tmp_path, {"MOSS-TTS-GGUF"})
    assert "1025×128" in done.stderr


# ----------------------------------------------------------------------------- errors in order


@pytest.mark.parametrize("model", ["./nope", "OpenMOSS-Team/Not-Cached", "not a repo/x/y"])
def test_a_model_that_is_not_there_is_named_before_the_codec(model: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty-hub"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", "all", "--model", model, "--output", "o"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(empty), "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and model in line, line
    assert DEFAULT_REPO not in line and "audio tokenizer" not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-hub"]


def test_a_file_given_as_model_is_named(tmp_path: Path) -> None:
    stray = tmp_path / "model.safetensors"
    stray.write_bytes(b"\0" * 16)
    done = run("all", "--model", str(stray), "--output", str(tmp_path / "w"), cache=tmp_path)
    assert done.returncode == 2 and str(stray) in done.stderr, done.stderr
    assert "audio tokenizer" not in done.stderr
