"""`all --merge-lora` (issue #49): PEFT LoRA adapters merged in float32 as the checkpoint streams.

The adapters are made by PEFT itself (`get_peft_model` + `save_pretrained`): on the tiny
backbone as transformers' Qwen3ForCausalLM (its keys then named as on MOSS-TTS, whose backbone
is `language_model`), and on a module holding MOSS's own head and table names. The reference
is the usual route: PEFT's `merge_and_unload` in float32, then llama.cpp's
convert_hf_to_gguf.py; our F16 backbone must equal it within one f16 ulp, untouched tensors
bit for bit."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_reading import gguf_reader
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.numpy import load_file, save_file
from transformers import Qwen3ForCausalLM

from moss_gguf_cli.pipeline.convert import convert
from moss_gguf_cli.source.lora import AdapterSpec, base_mismatch
from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TIMEOUT = 600


def run_all(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moss_gguf_cli", "all", *args],
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip


def backbone(tiny_extracted: Path) -> Qwen3ForCausalLM:
    return Qwen3ForCausalLM.from_pretrained(tiny_extracted / "qwen3_backbone",
                                            torch_dtype=torch.float32)  # fmt: skip


def randomize(model, seed: int, attention_b: bool = False) -> None:
    """Trained-looking factors: A random (PEFT's init), B random on the MLPs only, attention B
    left zero (as the community Norwegian adapter: only the MLPs were trained)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and ("mlp" in name or attention_b):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def as_moss(hf_adapter: Path, dest: Path) -> Path:
    """PEFT's save of a Qwen3ForCausalLM adapter, named as on MOSS-TTS (model. → language_model.),
    written with safetensors' own writer; the config as PEFT wrote it."""
    dest.mkdir(parents=True)
    tensors = load_file(hf_adapter / "adapter_model.safetensors")
    save_file({k.replace("base_model.model.model.", "base_model.model.language_model."): v
               for k, v in tensors.items()}, dest / "adapter_model.safetensors")  # fmt: skip
    shutil.copy(hf_adapter / "adapter_config.json", dest)
    return dest


@pytest.fixture(scope="module")
def codec(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("codec") / "audio_tokenizer"
    ensure_tiny_codec(folder)
    return folder


def make_adapter(tiny_extracted: Path, where: Path, seed: int, **config) -> Path:
    model = get_peft_model(backbone(tiny_extracted), LoraConfig(r=4, lora_alpha=8,
                                                                target_modules=TARGETS, **config))
    randomize(model, seed)
    model.save_pretrained(where / "hf")
    return where / "hf"


def reference_gguf(tiny_extracted: Path, adapters: list[Path], llama_tree: Path,
                   out: Path) -> Path:  # fmt: skip
    """PEFT's merge_and_unload in float32, one adapter after the other, then llama.cpp's own
    converter to F16."""
    model = backbone(tiny_extracted)
    for adapter in adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    folder = out.parent / "merged-hf"
    model.save_pretrained(folder)
    for f in (tiny_extracted / "qwen3_backbone").iterdir():
        if f.suffix in (".txt", ".json") and f.name not in ("config.json",):
            shutil.copy(f, folder)
    return convert(folder, out, outtype="f16", engine="llama.cpp", llama_cpp=llama_tree).outfile


def tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf_reader(path).tensors}


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    bits = "<i2" if a.dtype == np.float16 else "<i4"
    return int(np.abs(a.view(bits).astype(np.int64) - b.view(bits).astype(np.int64)).max())


@pytest.mark.parametrize("case", ["plain", "rslora-stacked"])
def test_the_merged_backbone_is_peft_then_llama_cpp(case, tiny_model, tiny_extracted,
                                                    tiny_f16_gguf, llama_tree, tmp_path):
    hf = [make_adapter(tiny_extracted, tmp_path / "a", 1)]
    if case == "rslora-stacked":  # a second adapter on top: rsLoRA, its own alpha for one module
        hf.append(make_adapter(tiny_extracted, tmp_path / "b", 2, use_rslora=True,
                               alpha_pattern={"down_proj": 32}))  # fmt: skip
    moss = [as_moss(a, a.parent / "moss") for a in hf]
    done = run_all("--model", str(tiny_model), "--output", str(tmp_path / "out"),
                   "--file-type", "F16", "--audio-tokenizer", "none",
                   *[x for m in moss for x in ("--merge-lora", str(m))])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    ours = tensors(tmp_path / "out" / "backbone_f16.gguf")
    ref = tensors(reference_gguf(tiny_extracted, hf, llama_tree, tmp_path / "ref" / "ref.gguf"))
    base = tensors(tiny_f16_gguf)
    assert set(ours) == set(ref)
    moved = {n for n in ours if not np.array_equal(ours[n], base[n])}
    assert moved == {f"blk.{i}.ffn_{p}.weight" for i in (0, 1) for p in ("gate", "up", "down")}
    for name in ours:
        if name in moved:
            assert ulps(ours[name], ref[name]) <= 1, name
        else:
            assert ours[name].tobytes() == ref[name].tobytes(), name


class MossHeads(torch.nn.Module):
    """The tensors of MOSS-TTS that are not the backbone's layers, under their own names, so
    PEFT writes an adapter for them exactly as it would on the whole model."""

    def __init__(self, ck: Path, n_vq: int):
        super().__init__()
        weights = {}
        for shard in ck.glob("*.safetensors"):
            weights.update({k: v for k, v in load_bf16_as_f32(shard).items()
                            if k.startswith(("emb_ext.", "lm_heads.", "language_model.embed"))})
        self.language_model = torch.nn.Module()
        self.language_model.embed_tokens = torch.nn.Embedding.from_pretrained(
            torch.from_numpy(weights["language_model.embed_tokens.weight"]))
        self.emb_ext = torch.nn.ModuleList(torch.nn.Embedding.from_pretrained(
            torch.from_numpy(weights[f"emb_ext.{i}.weight"])) for i in range(n_vq))
        self.lm_heads = torch.nn.ModuleList()
        for i in range(n_vq + 1):
            w = torch.from_numpy(weights[f"lm_heads.{i}.weight"])
            head = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            head.weight.data.copy_(w)
            self.lm_heads.append(head)


def load_bf16_as_f32(path: Path) -> dict[str, np.ndarray]:
    from safetensors.torch import load_file as load_torch

    return {k: v.float().numpy() for k, v in load_torch(path).items()}


def test_heads_and_tables_go_to_their_files(tiny_model, codec, tmp_path):
    n_vq = json.loads((tiny_model / "config.json").read_text())["n_vq"]
    targets = ["lm_heads.0", "lm_heads.3", "emb_ext.2", "language_model.embed_tokens"]
    model = get_peft_model(MossHeads(tiny_model, n_vq), LoraConfig(r=2, lora_alpha=4,
                                                                   target_modules=targets))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(tmp_path / "heads")
    keys = set(load_file(tmp_path / "heads" / "adapter_model.safetensors"))
    assert "base_model.model.emb_ext.2.lora_embedding_A" in keys  # PEFT's embedding form
    expected = model.merge_and_unload()
    done = run_all("--model", str(tiny_model), "--output", str(tmp_path / "out"),
                   "--file-type", "F16", "--audio-tokenizer", str(codec),
                   "--merge-lora", f"{tmp_path / 'heads'}:1.0")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "out"
    pairs = {"lm_heads/lm_head_text.npy": expected.lm_heads[0].weight,
             "lm_heads/lm_head_audio_02.npy": expected.lm_heads[3].weight,
             "embeddings/emb_ext_02.npy": expected.emb_ext[2].weight,
             "embeddings/embed_tokens.npy": expected.language_model.embed_tokens.weight,
             "lm_heads/lm_head_audio_00.npy": expected.lm_heads[1].weight}  # fmt: skip
    for rel, weight in pairs.items():
        want = weight.detach().numpy().astype(np.float16)
        assert ulps(np.load(out / rel), want) <= 1, rel
    ours = tensors(out / "backbone_f16.gguf")
    for gname, weight in (("output.weight", expected.lm_heads[0].weight),
                          ("token_embd.weight", expected.language_model.embed_tokens.weight)):
        assert ulps(ours[gname], weight.detach().numpy().astype(np.float16)) <= 1, gname
    # the merged folder speaks
    wav = tmp_path / "merged.wav"
    spoke = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "synth", "--config",
                            str(out / "moss-tts.yaml"), "--text", "Hei", "--output", str(wav),
                            "--max-new-tokens", "40"], capture_output=True, text=True,
                           timeout=TIMEOUT)  # fmt: skip
    assert spoke.returncode == 0 and wav.stat().st_size > 44, spoke.stderr[-2000:]


@pytest.fixture(scope="module")
def merged_folder(tiny_model, tiny_extracted, tmp_path_factory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("merged")
    adapter = as_moss(make_adapter(tiny_extracted, where, 4), where / "moss")
    done = run_all("--model", str(tiny_model), "--output", str(where / "out"),
                   "--file-type", "Q8_0", "--audio-tokenizer", "none",
                   "--merge-lora", f"{adapter}:0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return where / "out", adapter


def verify_rows(folder: Path, source: Path) -> tuple[int, dict[str, str]]:
    done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "verify", str(folder),
                           "--source", str(source), "--json"], capture_output=True, text=True,
                          timeout=TIMEOUT)  # fmt: skip
    rows = json.loads(done.stdout)["rows"]
    return done.returncode, {r["name"]: r["status"] for r in rows}


def test_the_manifest_and_config_say_what_was_merged(merged_folder):
    out, adapter = merged_folder
    manifest = json.loads((out / "manifest.json").read_text())
    sha = {f: hashlib.sha256((adapter / f).read_bytes()).hexdigest()
           for f in ("adapter_config.json", "adapter_model.safetensors")}  # fmt: skip
    assert manifest["lora"] == [{"adapter": str(adapter), "scale": 0.5, "sha256": sha}]
    assert manifest["made_from"]["lora"] == manifest["lora"]
    assert f"# Merged LoRA adapter: {adapter} (scale 0.5)" in (out / "moss-tts.yaml").read_text()


def test_verify_checks_the_merge_against_source_and_adapter(merged_folder, tiny_model, tmp_path):
    out, adapter = merged_folder
    code, rows = verify_rows(out, tiny_model)
    assert rows["merged adapters"] == "pass"
    assert rows["GGUF vs source"] == rows["tables vs source"] == "pass"
    # the same folder said to be unmerged: its merged tensors no longer match the source
    copy = tmp_path / "unmerged"
    shutil.copytree(out, copy, symlinks=True)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["lora"] = []
    (copy / "manifest.json").write_text(json.dumps(manifest))
    _, rows = verify_rows(copy, tiny_model)
    assert rows["GGUF vs source"] == "fail" and "merged adapters" not in rows
    # another adapter in its place: refused in one line, naming it
    changed = tmp_path / "changed"
    shutil.copytree(adapter, changed)
    data = load_file(changed / "adapter_model.safetensors")
    data = {k: v * 2 for k, v in data.items()}
    save_file(data, adapter / "adapter_model.safetensors")
    try:
        done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "verify", str(out),
                               "--source", str(tiny_model)], capture_output=True, text=True,
                              timeout=TIMEOUT)  # fmt: skip
    finally:
        shutil.copy(changed / "adapter_model.safetensors", adapter)
    assert done.returncode != 0 and "sha256 differ" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_rerun_without_the_adapter_is_another_input(merged_folder, tiny_model):
    out, _ = merged_folder
    done = run_all("--model", str(tiny_model), "--output", str(out), "--file-type", "Q8_0",
                   "--audio-tokenizer", "none")  # fmt: skip
    assert done.returncode != 0 and "lora" in done.stderr, done.stderr


def refused(tiny_model: Path, adapter: Path, tmp_path: Path, *extra: str) -> str:
    out = tmp_path / "refused"
    done = run_all("--model", str(tiny_model), "--output", str(out), "--file-type", "Q8_0",
                   "--audio-tokenizer", "none", "--merge-lora", str(adapter), *extra)
    assert done.returncode != 0
    assert not out.exists() and not list(tmp_path.glob(".refused*")), "nothing is written"
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) <= 2, done.stderr
    return done.stderr


def test_an_adapter_for_another_base_is_refused(tiny_model, tiny_extracted, tmp_path):
    adapter = as_moss(make_adapter(tiny_extracted, tmp_path / "a", 5), tmp_path / "moss")
    weights = adapter / "adapter_model.safetensors"
    good = load_file(weights)
    key = "base_model.model.language_model.layers.0.mlp.up_proj.lora_B.weight"
    save_file({**good, key: np.zeros((good[key].shape[0] + 8, 4), np.float32)}, weights)
    assert "do not fit" in refused(tiny_model, adapter, tmp_path)
    deeper = {k.replace("layers.1.", "layers.7."): v for k, v in good.items()}
    save_file(deeper, weights)
    assert "targets layer 7" in refused(tiny_model, adapter, tmp_path)
    save_file(good, weights)
    config = json.loads((adapter / "adapter_config.json").read_text())
    for change, words in (({"use_dora": True}, "DoRA"), ({"peft_type": "IA3"}, "IA3")):
        (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
        assert words in refused(tiny_model, adapter, tmp_path)
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert "--keep-intermediate" in refused(tiny_model, adapter, tmp_path, "--keep-intermediate")


def test_the_base_an_adapter_names_is_checked():
    from moss_gguf_cli.source.lora import Adapter

    def named(base: str | None, revision: str | None = None) -> Adapter:
        config = {"base_model_name_or_path": base, "revision": revision}
        return Adapter(AdapterSpec("x"), Path("x"), None, config, None)

    source = {"repo": "OpenMOSS-Team/MOSS-TTS", "commit": "58b20a0aaa"}
    assert base_mismatch(named("OpenMOSS-Team/MOSS-TTS"), source) is None
    assert base_mismatch(named(None), source) is None
    assert base_mismatch(named("OpenMOSS-Team/MOSS-TTS", "58b20a0"), source) is None
    assert "MOSS-TTS-v1.5" in base_mismatch(named("OpenMOSS-Team/MOSS-TTS-v1.5"), source)
    assert "@0123abc" in base_mismatch(named("OpenMOSS-Team/MOSS-TTS", "0123abc"), source)
    assert base_mismatch(named("OpenMOSS-Team/MOSS-TTS-v1.5"), {"folder": "/m"}) is None
    assert AdapterSpec.parse("org/adapter:0.5") == AdapterSpec("org/adapter", 0.5)
    assert AdapterSpec.parse("/a:b/adapter") == AdapterSpec("/a:b/adapter", 1.0)


def test_hub_adapters_and_the_base_they_name(tiny_model, tiny_extracted, tmp_path):
    """Model and adapters from a Hub cache laid out by huggingface_hub's own writers, offline:
    an adapter naming this base merges; one naming another base is refused unless
    --force-base, which merges it with a warning."""
    from test_hub_weights import add_repo, files_of, run

    cache = tmp_path / "hub"
    add_repo(cache, "OpenMOSS-Team/MOSS-TTS", files_of(tiny_model))
    adapter = as_moss(make_adapter(tiny_extracted, tmp_path / "a", 6), tmp_path / "moss")
    for repo, base in (("someone/moss-tts-lora", "OpenMOSS-Team/MOSS-TTS"),
                       ("someone/v15-lora", "OpenMOSS-Team/MOSS-TTS-v1.5")):  # fmt: skip
        config = json.loads((adapter / "adapter_config.json").read_text())
        (adapter / "adapter_config.json").write_text(
            json.dumps({**config, "base_model_name_or_path": base}))
        add_repo(cache, repo, files_of(adapter))
    common = ("all", "--model", "OpenMOSS-Team/MOSS-TTS", "--file-type", "Q8_0",
              "--audio-tokenizer", "none")  # fmt: skip
    done = run(*common, "--output", str(tmp_path / "ok"), "--merge-lora",
               "someone/moss-tts-lora", cache=cache)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "ok" / "manifest.json").read_text())["lora"]
    assert [r["adapter"] for r in record] == ["someone/moss-tts-lora"]
    other = run(*common, "--output", str(tmp_path / "other"), "--merge-lora",
                "someone/v15-lora", cache=cache)  # fmt: skip
    assert other.returncode != 0 and "MOSS-TTS-v1.5" in other.stderr and "--force-base" in \
        other.stderr and not (tmp_path / "other").exists()  # fmt: skip
    forced = run(*common, "--output", str(tmp_path / "forced"), "--merge-lora",
                 "someone/v15-lora", "--force-base", cache=cache)  # fmt: skip
    assert forced.returncode == 0 and "--force-base" in forced.stderr + forced.stdout
