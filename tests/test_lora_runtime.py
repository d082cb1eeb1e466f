"""LoRA adapters applied at run time (issue #50): `convert --format lora`, `synth --lora`,
`serve --lora`.

Adapters are made by PEFT itself on the tiny backbone (test_lora's helpers), named as on
MOSS-TTS. The reference for the adapter GGUF is the pinned llama.cpp's convert_lora_to_gguf.py
given the extracted backbone as --base (and the adapter under the backbone's own names)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from peft import LoraConfig, get_peft_model
from safetensors.numpy import load_file, save_file
from test_lora import TARGETS, as_moss, backbone, randomize

TIMEOUT = 600


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moss_gguf_cli", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env)  # fmt: skip


def peft_adapter(tiny_extracted: Path, where: Path, seed: int, attention_b: bool = True,
                 **config) -> Path:  # fmt: skip
    """PEFT's save of a trained-looking adapter on the tiny backbone (Qwen3 names)."""
    model = get_peft_model(
        backbone(tiny_extracted), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, **config)
    )
    randomize(model, seed, attention_b=attention_b)
    model.save_pretrained(where)
    return where


def llama_cpp_lora(llama_tree: Path, hf_adapter: Path, base: Path, out: Path, outtype: str) -> Path:
    env = {**os.environ, "PYTHONPATH": str(llama_tree / "gguf-py"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(llama_tree / "convert_lora_to_gguf.py"),
                           str(hf_adapter), "--base", str(base), "--outfile", str(out),
                           "--outtype", outtype], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def convert_lora(adapter: Path, out: Path, *extra: str, base: str = "builtin:tiny"):
    return cli("convert", str(adapter), "--format", "lora", "--base", base, "--outfile",
               str(out), *extra)  # fmt: skip


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2, \
        done.stderr  # fmt: skip
    return done.stderr


@pytest.fixture(scope="module")
def adapters(tiny_extracted, tmp_path_factory) -> dict[str, Path]:
    """PEFT adapters: "plain" (every pair trained, Qwen3 names as PEFT wrote them), "zeros"
    (attention B left zero, as the Norwegian adapter), "patterned" (rsLoRA with an
    alpha_pattern), each also named as on MOSS-TTS ("moss-…")."""
    root = tmp_path_factory.mktemp("adapters")
    made = {"plain": peft_adapter(tiny_extracted, root / "plain", 11),
            "zeros": peft_adapter(tiny_extracted, root / "zeros", 12, attention_b=False),
            "patterned": peft_adapter(tiny_extracted, root / "patterned", 13, use_rslora=True,
                                      alpha_pattern={"down_proj": 32})}  # fmt: skip
    for name in list(made):
        made[f"moss-{name}"] = as_moss(made[name], root / f"moss-{name}")
    return made


@pytest.fixture(scope="module")
def lora_ggufs(adapters, tmp_path_factory) -> dict[str, Path]:
    """Our adapter GGUFs (f32) of the MOSS-named adapters, for builtin:tiny."""
    root = tmp_path_factory.mktemp("lora-gguf")
    out = {}
    for name in ("plain", "zeros", "patterned"):
        done = convert_lora(adapters[f"moss-{name}"], root / f"{name}.gguf")
        assert done.returncode == 0, done.stderr[-2000:]
        out[name] = root / f"{name}.gguf"
    return out


def gguf_tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


# ----------------------------------------------------------------------------- convert


def test_the_adapter_gguf_is_llama_cpps(adapters, tiny_extracted, llama_tree, tmp_path):
    """Every tensor byte for byte, type and order as convert_lora_to_gguf.py's, per out type."""
    for outtype in ("f32", "bf16", "q8_0"):
        ref = gguf_tensors(llama_cpp_lora(llama_tree, adapters["plain"],
                                          tiny_extracted / "qwen3_backbone",
                                          tmp_path / f"ref-{outtype}.gguf", outtype))  # fmt: skip
        extra = () if outtype == "f32" else ("--outtype", outtype)  # f32 is the default
        done = convert_lora(adapters["moss-plain"], tmp_path / f"ours-{outtype}.gguf", *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        ours = gguf_tensors(tmp_path / f"ours-{outtype}.gguf")
        assert list(ours) == list(ref), outtype
        for name, t in ours.items():
            r = ref[name]
            assert (t.tensor_type, list(t.shape)) == (r.tensor_type, list(r.shape)), name
            assert bytes(t.data) == bytes(r.data), (outtype, name)
        reader = gguf.GGUFReader(tmp_path / f"ours-{outtype}.gguf")
        assert reader.fields["general.type"].contents() == "adapter"
        assert reader.fields["adapter.lora.alpha"].contents() == 8.0
        assert reader.fields["adapter.moss_gguf.base.model"].contents() == "builtin:tiny"
        assert reader.fields["adapter.moss_gguf.base.digest"].contents().startswith("sha256:")


def test_zero_pairs_are_left_out_and_scales_folded(adapters, lora_ggufs, tiny_extracted,
                                                   llama_tree, tmp_path):  # fmt: skip
    # the untrained attention pairs: left out, the rest as llama.cpp's converter writes them
    ref = gguf_tensors(llama_cpp_lora(llama_tree, adapters["zeros"],
                                      tiny_extracted / "qwen3_backbone", tmp_path / "z.gguf",
                                      "f32"))  # fmt: skip
    ours = gguf_tensors(lora_ggufs["zeros"])
    assert set(ours) == {f"blk.{i}.ffn_{p}.weight.lora_{f}" for i in (0, 1)
                         for p in ("gate", "up", "down") for f in "ab"}  # fmt: skip
    assert all(bytes(t.data) == bytes(ref[n].data) for n, t in ours.items())
    # rsLoRA: alpha·√r; down_proj's own alpha folded into its lora_b, so that llama.cpp's
    # alpha/rank gives PEFT's scale (alpha/√r) on every module
    reader = gguf.GGUFReader(lora_ggufs["patterned"])
    assert reader.fields["adapter.lora.alpha"].contents() == pytest.approx(8 * 2)
    raw = load_file(adapters["patterned"] / "adapter_model.safetensors")
    got = gguf_tensors(lora_ggufs["patterned"])
    for layer in (0, 1):
        for proj, gname, want in (("down_proj", "ffn_down", 32 / 2), ("up_proj", "ffn_up", 8 / 2)):
            b = raw[f"base_model.model.model.layers.{layer}.mlp.{proj}.lora_B.weight"]
            llama_scale = 16 / 4  # alpha_file / rank
            lb = np.array(got[f"blk.{layer}.{gname}.weight.lora_b"].data)
            np.testing.assert_allclose(lb * llama_scale, b * want, rtol=1e-6)


def test_heads_tables_and_bad_input_are_refused_in_one_line(adapters, tmp_path):
    heads = tmp_path / "heads"
    shutil.copytree(adapters["moss-plain"], heads)
    weights = heads / "adapter_model.safetensors"
    good = load_file(weights)
    save_file({**good, "base_model.model.lm_heads.3.lora_A.weight": np.ones((4, 256), np.float32),
               "base_model.model.lm_heads.3.lora_B.weight": np.ones((1025, 4), np.float32)},
              weights)  # fmt: skip
    out = tmp_path / "x.gguf"
    err = one_line_error(convert_lora(heads, out))
    assert "lm_heads.3" in err and "--merge-lora" in err and not out.exists()
    save_file({k.replace("layers.1.", "layers.5."): v for k, v in good.items()}, weights)
    assert "targets layer 5" in one_line_error(convert_lora(heads, out))
    assert "--base" in one_line_error(cli("convert", str(adapters["moss-plain"]), "--format",
                                          "lora", "--outfile", str(out)))  # fmt: skip
    assert not out.exists() and not list(tmp_path.glob(".x.gguf*"))


def test_an_adapter_naming_another_base_needs_force_base(adapters, tiny_model, tmp_path):
    """The base in adapter_config.json against --base (a Hub id, so known): refused naming
    --force-base, which converts it with a warning, the file naming --base as its base."""
    import json

    from test_hub_weights import add_repo, files_of, run

    cache = tmp_path / "hub"
    add_repo(cache, "OpenMOSS-Team/MOSS-TTS", files_of(tiny_model))
    adapter = tmp_path / "v15"
    shutil.copytree(adapters["moss-plain"], adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "OpenMOSS-Team/MOSS-TTS-v1.5"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    out = tmp_path / "v15.gguf"
    common = ("convert", str(adapter), "--format", "lora", "--base", "OpenMOSS-Team/MOSS-TTS",
              "--outfile", str(out))  # fmt: skip
    err = one_line_error(run(*common, cache=cache))
    assert "MOSS-TTS-v1.5" in err and "--force-base" in err and not out.exists()
    forced = run(*common, "--force-base", cache=cache)
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert "--force-base" in forced.stderr
    named = gguf.GGUFReader(out).fields["adapter.moss_gguf.base.model"].contents()
    assert named.startswith("OpenMOSS-Team/MOSS-TTS@")
    assert "--format lora" in one_line_error(cli("convert", str(adapter), "--outfile",
                                                 str(tmp_path / "b.gguf"), "--force-base"))


# ----------------------------------------------------------------------------- synth


def synth(weights: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("synth", "--config", str(weights / "moss-tts.yaml"), "--text", "Hei", "--output",
               str(out), "--text-temperature", "0", "--audio-temperature", "0", *extra)  # fmt: skip


def test_scale_zero_is_no_adapter_and_an_adapter_changes_greedy_audio(tiny_weights, lora_ggufs,
                                                                      tmp_path):  # fmt: skip
    wavs = {}
    for case, extra in (("none", ()), ("zero", ("--lora", f"{lora_ggufs['plain']}:0")),
                        ("plain", ("--lora", str(lora_ggufs["plain"]))),
                        ("stacked", ("--lora", f"{lora_ggufs['plain']}:0.5", "--lora",
                                     f"{lora_ggufs['zeros']}:2"))):  # fmt: skip
        done = synth(tiny_weights, tmp_path / f"{case}.wav", *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        wavs[case] = (tmp_path / f"{case}.wav").read_bytes()
    assert wavs["zero"] == wavs["none"]
    assert wavs["plain"] != wavs["none"] and wavs["stacked"] not in (wavs["none"], wavs["plain"])


def test_on_an_f16_base_it_lands_on_the_f16_merge(tiny_model, tiny_weights, adapters, lora_ggufs,
                                                  tmp_path):  # fmt: skip
    """The audio logits of base F16 + run-time adapter against part 1's F16 merge (`all
    --merge-lora`'s code: the checkpoint merged in float32, then the native converter): they
    differ by the f16 rounding of the merged weights only, under 2% of the adapter's effect
    (0.5% measured)."""
    from moss_gguf_cli.pipeline.convert import convert
    from moss_gguf_cli.source.checkpoint import open_checkpoint
    from moss_gguf_cli.source.lora import AdapterSpec, merged, open_adapter, plan_merge
    from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

    ck = open_checkpoint(tiny_model)
    deltas = plan_merge(ck, [open_adapter(AdapterSpec(str(adapters["moss-plain"])))])
    merged_f16 = convert(merged(ck, deltas), tmp_path / "merged.gguf", outtype="f16").outfile
    tables = tiny_weights / "embeddings"
    rng = np.random.default_rng(0)
    rows = np.load(tables / "embed_tokens.npy", mmap_mode="r")[rng.integers(0, 150000, 24)]
    rows = rows.astype(np.float32) + sum(np.load(tables / f"emb_ext_{k:02d}.npy")[1024]
                                         .astype(np.float32) for k in range(32))  # fmt: skip
    heads = np.stack([np.load(tiny_weights / "lm_heads" / f"lm_head_audio_{k:02d}.npy")
                      for k in range(32)]).astype(np.float32)  # fmt: skip

    def audio_logits(gguf_path: Path, lora: Path | None = None) -> np.ndarray:
        with Backbone(gguf_path, BackboneSettings(n_ctx=256, n_batch=64, n_threads=1)) as b:
            if lora is not None:
                b.use_adapters([(b.load_adapter(lora), 1.0)])
            return np.einsum("th,kvh->tkv", b.hidden_states(rows), heads)

    base_f16 = tiny_weights / "backbone_f16.gguf"
    base = audio_logits(base_f16)
    runtime = audio_logits(base_f16, lora_ggufs["plain"])
    merge = audio_logits(merged_f16)
    effect = np.abs(runtime - base).max()
    assert effect > 0.05
    assert np.abs(runtime - merge).max() < 0.02 * effect


def test_an_adapter_for_another_base_is_refused_at_load(
    adapters, tiny_weights, lora_ggufs, llama_tree, tiny_extracted, tmp_path
):
    # made for another model (builtin:tiny-soundeffect has tiny's dims)
    other = tmp_path / "other.gguf"
    done = convert_lora(adapters["moss-plain"], other, base="builtin:tiny-soundeffect")
    assert done.returncode == 0, done.stderr[-2000:]
    err = one_line_error(synth(tiny_weights, tmp_path / "x.wav", "--lora", str(other)))
    assert "tiny-soundeffect" in err and "builtin:tiny" in err
    # the same model name, other weights (a folder whose first audio head differs)
    folder = tmp_path / "weights"
    shutil.copytree(tiny_weights, folder, symlinks=True)
    (folder / "lm_heads").unlink()
    shutil.copytree(tiny_weights / "lm_heads", folder / "lm_heads")
    head = np.load(folder / "lm_heads" / "lm_head_audio_00.npy")
    np.save(folder / "lm_heads" / "lm_head_audio_00.npy", head * np.float16(1.5))
    err = one_line_error(synth(folder, tmp_path / "y.wav", "--lora", str(lora_ggufs["plain"])))
    assert "weights differ" in err and "lm_head_audio_00.npy" in err
    # read back from a first-class file whose audio heads were quantized: the digest cannot
    # match even for its own base, and the line says why rather than "weights differ"
    import json

    meta = json.loads((folder / "extraction_meta.json").read_text())
    meta["first_class"] = {"file": "m.gguf", "tables": "dequantized", "table_types": {"Q8_0": 64},
                           "dequantized": ["lm_head_audio_00"], "rounded": []}  # fmt: skip
    (folder / "extraction_meta.json").write_text(json.dumps(meta))
    err = one_line_error(synth(folder, tmp_path / "y.wav", "--lora", str(lora_ggufs["plain"])))
    assert "quantized first-class GGUF" in err and "weights differ" not in err
    # llama.cpp's own converter's file names no base
    plain = llama_cpp_lora(llama_tree, adapters["plain"], tiny_extracted / "qwen3_backbone",
                           tmp_path / "theirs.gguf", "f32")  # fmt: skip
    err = one_line_error(synth(tiny_weights, tmp_path / "z.wav", "--lora", str(plain)))
    assert "which base" in err and not (tmp_path / "z.wav").exists()


# ----------------------------------------------------------------------------- serve


def serve(config: Path, log: Path, *args: str):
    """test_serve's start_serve: `moss-gguf serve` started, the URL it announces."""
    from test_serve import start_serve

    command = "serve"  # what ARGS are options of (test_readme_options reads it here)
    assert command in start_serve.__code__.co_consts
    return start_serve(config, log, *args)


def test_serve_two_adapters_concurrently_each_as_alone(tiny_weights, lora_ggufs, tmp_path):
    """The official openai client; two adapters on one server. Requests with different sets
    never share a batch, so each concurrent answer is the bytes of that adapter alone."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import openai
    from test_serve import GREEDY, KEY

    srv = serve(tiny_weights / "moss-tts.yaml", tmp_path / "serve.log", "--api-key", KEY,
                      "--max-batch", "2", "--lora", f"nor={lora_ggufs['plain']}",
                      "--lora", f"emo={lora_ggufs['zeros']}")  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=120)

        def speak(lora: dict | None) -> bytes:
            extra = {**GREEDY, **({"lora": lora} if lora is not None else {})}
            return client.audio.speech.create(model="moss-tts", voice="alloy", input="Hei",
                                              response_format="wav", extra_body=extra).content

        sets = [None, {"nor": 1.0}, {"emo": 1.0}, {"nor": 0.5, "emo": 2.0}]
        alone = [speak(s) for s in sets]
        assert len(set(alone)) == len(alone)  # each set speaks otherwise
        assert speak({"nor": 0}) == alone[0]  # scale 0 is no adapter
        with ThreadPoolExecutor(len(sets) * 2) as pool:
            together = list(pool.map(speak, sets * 2))
        assert together == alone * 2
        models = client.models.list().data
        assert models[0].model_extra["lora"] == ["emo", "nor"]
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}) as h:
            bad = h.post("/v1/audio/speech", json={"model": "moss-tts", "input": "Hei",
                                                   "lora": {"other": 1}})  # fmt: skip
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora"
    finally:
        assert srv.stop() == 0
