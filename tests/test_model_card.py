"""The model card (README.md) `all` and `layout` write: it parses with huggingface_hub's
ModelCard, its metadata is what the Hub reads for a quantized GGUF, and its body names every
file of the manifest with the sha256 the file has. Three sources: builtin, a local folder, and
a Hub repo in a cache laid out by huggingface_hub's own writers (offline)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.utils import validate_repo_id
from test_hub_weights import COMMIT, add_repo, codec_files, files_of, run  # noqa: F401

from moss_gguf_cli.source.audio_tokenizer import DEFAULT_REPO

SOURCE_REPO = "OpenMOSS-Team/MOSS-TTS"
LICENSE_TEXT = "Permission is hereby granted, to the tiny model, a licence text to be linked."
SOURCE_CARD = f"""---
license: apache-2.0
language:
- en
- zh
pipeline_tag: text-to-speech
---

# MOSS-TTS

{LICENSE_TEXT}
"""


def checked_card(folder: Path) -> ModelCard:
    """The card, parsed by huggingface_hub, with the metadata the Hub's GGUF pages read."""
    card = ModelCard.load(folder / "README.md")
    data = card.data
    assert data.pipeline_tag == "text-to-speech" and data.library_name == "gguf"
    assert {"gguf", "moss-tts"} <= set(data.tags)
    # the metadata survives huggingface_hub's own model of it unchanged
    assert ModelCardData(**data.to_dict()).to_dict() == data.to_dict()
    if data.base_model is not None:
        validate_repo_id(data.base_model)  # the Hub takes a repo id there, nothing else
        assert data.base_model_relation == "quantized"
    else:
        assert "base_model_relation" not in data.to_dict()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["card"] == "README.md"
    assert "README.md" not in {f["path"] for f in manifest["files"]}
    listed = dict(re.findall(r"^([0-9a-f]{64})  (\S+)$", card.text, re.M))
    assert {v: k for k, v in listed.items()} == {f["path"]: f["sha256"] for f in manifest["files"]}
    for sha, rel in listed.items():
        assert hashlib.sha256((folder / rel).read_bytes()).hexdigest() == sha, rel
    return card


def test_builtin_run_writes_a_card_without_base_model_and_verify_passes(builds, tmp_path) -> None:
    done = builds.all("--model", "builtin:tiny")  # the run's shared build
    out = done.path
    assert "no base_model" in done.stderr and "--base-model" in done.stderr
    card = checked_card(out)
    assert card.data.base_model is None and card.data.license is None
    assert "| `backbone_q4_k_m.gguf` | GGUF Q4_K_M |" in card.text
    assert re.search(r"\| `backbone_q4_k_m\.gguf` .* \| \d+\.\d\d \|", card.text)
    assert "`moss-gguf verify`: all checks pass" in card.text
    assert "moss-gguf synth --config weights/moss-tts.yaml" in card.text
    assert "moss-gguf serve --config weights/moss-tts.yaml" in card.text
    assert f"moss-gguf all --model builtin:tiny --output {out}" in card.text
    checked = run("verify", str(out), cache=tmp_path / "hub")
    assert checked.returncode == 0, checked.stdout


def test_a_local_folder_names_its_base_model_and_carries_the_source_card(
    tiny_model: Path, tmp_path: Path
) -> None:
    src = tmp_path / "MOSS-TTS-local"
    shutil.copytree(tiny_model, src)
    (src / "README.md").write_text(SOURCE_CARD)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "_name_or_path": SOURCE_REPO}))
    out = tmp_path / "w"
    done = run("all", "--model", str(src), "--output", str(out), "-q",
               "--audio-tokenizer", "none", cache=tmp_path / "hub")  # fmt: skip
    assert done.returncode == 0, done.stderr
    card = checked_card(out)
    assert card.data.base_model == SOURCE_REPO  # the config's _name_or_path
    assert card.data.license == "apache-2.0" and card.data.language == ["en", "zh"]
    assert LICENSE_TEXT not in card.text  # linked, not copied
    assert f"https://huggingface.co/{SOURCE_REPO}" in card.text
    # --base-model wins over the config
    again = run("all", "--model", str(src), "--output", str(out), "-q", "--audio-tokenizer",
                "none", "--base-model", "someone/MOSS-TTS-fork", cache=tmp_path / "hub")
    assert again.returncode == 0, again.stderr
    assert checked_card(out).data.base_model == "someone/MOSS-TTS-fork"


def test_a_bad_base_model_is_one_line_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "w"
    done = run("all", "--model", "builtin:tiny", "--output", str(out), "--base-model",
               "not a repo", cache=tmp_path / "hub")  # fmt: skip
    assert done.returncode != 0
    assert "--base-model" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_a_hub_source_names_repo_and_commit_and_carries_its_card(
    tiny_model: Path, codec_files: Path, tmp_path: Path  # noqa: F811
) -> None:
    cache = tmp_path / "hub"
    readme = tmp_path / "README.md"
    readme.write_text(SOURCE_CARD)
    add_repo(cache, SOURCE_REPO, {**files_of(tiny_model), "README.md": readme})
    add_repo(cache, DEFAULT_REPO, files_of(codec_files))
    out = tmp_path / "w"
    done = run("all", "--model", SOURCE_REPO, "--output", str(out), "-q", cache=cache)
    assert done.returncode == 0, done.stderr
    card = checked_card(out)
    assert card.data.base_model == SOURCE_REPO
    assert card.data.license == "apache-2.0" and card.data.language == ["en", "zh"]
    assert f"at commit `{COMMIT}`" in card.text
    assert LICENSE_TEXT not in card.text


def test_layout_writes_the_card_too(
    tiny_extracted: Path, tiny_f16_gguf: Path, tmp_path: Path
) -> None:
    gguf = tiny_f16_gguf
    out = tmp_path / "w"
    done = run("layout", "--extracted", str(tiny_extracted), "--gguf", str(gguf), "--output",
               str(out), "--audio-tokenizer", "none", "--base-model", SOURCE_REPO,
               cache=tmp_path / "hub")  # fmt: skip
    assert done.returncode == 0, done.stderr
    card = checked_card(out)
    assert card.data.base_model == SOURCE_REPO
    assert "not run yet: moss-gguf verify" in card.text
