"""`all` on MOSS-TTS-Realtime (#63): the Hub id offline from a cache huggingface_hub's writers
laid out, with its codec; the options it has no use for refused in one line before any work;
the backbone a stock `qwen3` GGUF llama.cpp loads unchanged; verify catching a changed tensor."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from test_hub_weights import add_repo, files_of, run

from moss_gguf_cli.realtime.tiny import ensure_tiny_realtime
from moss_gguf_cli.source.audio_tokenizer import DEFAULT_REPO as CODEC_REPO
from moss_gguf_cli.source.tiny import cache_root
from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

HUB_ID = "OpenMOSS-Team/MOSS-TTS-Realtime"


def test_the_hub_id_converts_offline_with_its_codec(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    add_repo(cache, HUB_ID, files_of(ensure_tiny_realtime()))
    codec = ensure_tiny_codec(cache_root() / "builtin" / "tiny-codec")[0].parent
    add_repo(cache, CODEC_REPO, files_of(codec))
    out = tmp_path / "w"
    done = run("all", "--model", HUB_ID, "--output", str(out), "--file-type", "Q4_K_M",
               "--file-type", "BF16", cache=cache)  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["made_from"]["source"]["repo"] == HUB_ID
    assert manifest["audio_tokenizer"] == CODEC_REPO
    assert sorted(manifest["quant_types"]) == [
        "realtime_backbone_bf16.gguf", "realtime_backbone_q4_k_m.gguf",
        "realtime_depth_bf16.gguf", "realtime_depth_q4_k_m.gguf"]  # fmt: skip
    assert {p.name for p in out.glob("*.yaml")} == {"moss-tts-realtime.yaml",
                                                     "moss-tts-realtime-bf16.yaml"}
    # the stock architecture, tied: llama.cpp's own loader takes it and runs a row
    reader = gguf.GGUFReader(out / "realtime_backbone_q4_k_m.gguf")
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "qwen3"
    assert "output.weight" not in {t.name for t in reader.tensors}
    settings = BackboneSettings(n_ctx=64, n_threads=2)
    with Backbone(out / "realtime_backbone_q4_k_m.gguf", settings) as backbone:
        hidden, _ = backbone.prefill(np.ones((3, 64), np.float32), logits=False)
        assert np.isfinite(hidden).all() and hidden.shape == (64,)


@pytest.mark.parametrize(("extra", "said"), [
    (("--format", "moss-tts-delay"), "--format moss-tts-delay does not apply to MOSS-TTS-Realtime"),
    (("--audio-tables-type", "f16"), "--audio-tables-type does not apply to MOSS-TTS-Realtime"),
    (("--merge-lora", "x.safetensors"), "--merge-lora does not apply to MOSS-TTS-Realtime"),
    (("--file-type", "IQ2_XS"), "--file-type IQ2_XS has no rule for MOSS-TTS-Realtime"),
])  # fmt: skip
def test_options_it_has_no_use_for_are_refused_in_one_line(tmp_path, extra, said) -> None:
    done = run("all", "--model", "builtin:tiny-realtime", "--output", str(tmp_path / "w"),
               *extra, cache=tmp_path / "hub")  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and said in lines[0], done.stderr
    assert not (tmp_path / "w").exists()


def test_verify_catches_a_changed_tensor_the_manifest_agrees_with(builds, tmp_path) -> None:
    """A depth head's value changed and the manifest made to agree: only the values tell."""
    folder = builds.copy(builds.all("--model", "builtin:tiny-realtime").path, tmp_path / "w")
    path = folder / "realtime_depth_q8_0.gguf"
    data = bytearray(path.read_bytes())
    reader = gguf.GGUFReader(path)
    head = next(t for t in reader.tensors if t.name == "depth_head.3.weight")
    data[int(head.data_offset) + 40] ^= 0x7F  # inside a block's quants
    path.unlink()
    path.write_bytes(bytes(data))
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["path"] == path.name:
            entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    done = run("verify", str(folder), "--json", cache=tmp_path / "hub")
    report = json.loads(done.stdout)
    failed = {r["name"]: r["detail"] for r in report["rows"] if r["status"] == "fail"}
    assert done.returncode == 1 and list(failed) == ["realtime_depth_q8_0.gguf: values"], failed
    assert "depth_head.3.weight (Q8_0)" in failed["realtime_depth_q8_0.gguf: values"]


def test_verify_deep_runs_each_gguf_against_the_exact_files(builds, tmp_path) -> None:
    folder = builds.all("--model", "builtin:tiny-realtime").path
    done = run("verify", str(folder), "--deep", "--json", cache=tmp_path / "hub")
    report = json.loads(done.stdout)
    deep = {r["name"]: r for r in report["rows"] if r["group"] == "deep"}
    assert done.returncode == 0 and report["ok"], done.stderr
    assert sorted(deep) == ["realtime_backbone_q8_0.gguf: ours vs exact",
                            "realtime_depth_q8_0.gguf: ours vs exact"]  # fmt: skip
    assert all(r["status"] == "pass" for r in deep.values()), deep
    # without the source there is nothing exact to run against: one line
    copy = builds.copy(folder, tmp_path / "w")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["source_model"] = str(tmp_path / "gone")
    (copy / "manifest.json").unlink()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    done = run("verify", str(copy), "--deep", cache=tmp_path / "hub")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--deep compares" in lines[0], done.stderr
