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
