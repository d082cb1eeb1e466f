"""The first-class `moss-tts-delay` GGUF: every byte as OpenMOSS's llama.cpp fork writes it.

CI cannot build the fork, so its outputs are held here as sha256 values, made from the tests'
own deterministic checkpoints with the fork itself:

  fork: https://github.com/expectqwq/llama.cpp  commit 7d26f9138947778ff471e278eb5a148c70777633
  built: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF
         (+ python -m moss_gguf_cli.native.cpu_features --cmake-args); cmake --build build
         --target llama-quantize llama-moss-tts
  converter: PYTHONPATH=gguf-py python convert_hf_to_gguf.py MODEL --outtype f16|bf16
             --outfile fork_f16.gguf   (transformers 5.25.0, torch 2.13.0)
  quantizer: build/bin/llama-quantize fork_f16.gguf fork_TYPE.gguf TYPE

MODEL is builtin:tiny (it lives at $MOSS_GGUF_CACHE/builtin/tiny-v3) and the "odd"
checkpoint below (rows of 320 and 832: no K-quant fits, llama.cpp's fallbacks), written by
moss_gguf_cli.source.tiny.write_tiny into a folder named `model`. The folder's name matters: the
converter derives general.name/version/basename from it (gguf's model-card heuristics).
A change to tiny.py (BUILDER_VERSION) or to the tokenizer it copies changes these values;
they are then made again with the commands above.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_reading import gguf_reader

from moss_gguf_cli.disk.digests import sha256_file
from moss_gguf_cli.errors import InputError
from moss_gguf_cli.gguf.first_class_read import check_first_class
from moss_gguf_cli.pipeline.first_class import convert_first_class
from moss_gguf_cli.quantize.direct import quantize_checkpoint
from moss_gguf_cli.quantize.llama import QuantizeSettings
from moss_gguf_cli.source.first_class import plan_first_class

TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
GOLDEN = {
    "tiny": {
        "F16": "c83b34fd91eb8d4fa8e3cbf3477b8a98837106d4fb702ef3cb4768c934c31612",
        "BF16": "87c9aabe347263dcbe4ab318e30271eefad5b69bebd9fc6f577e7f7c273fabcf",
        "Q4_K_M": "aab565661d92bba0d637aea77d07add1eac47eaba7587e08e22288405f76146c",
        "Q5_K_M": "872c53257b0cde4dbd680560e5cab7e73366011dd93f2f9d68ef776af3f702ab",
        "Q6_K": "7f3cf16e5af4de05da8f6b70b04a94477155042cf228d173d92bc0402dd81781",
        "Q8_0": "2d06f02d65610d80d78d7316452e0c356a85db0eab105d0e94665b3cd0d0136a",
    },
    "odd": {
        "F16": "49d8f730f510d04ba01c74a2ce330a97178d9a920e5d22f3e5a16660479874a8",
        "BF16": "a4664668714c9cfc3917c831e51d90dca192271060a0f1ea35cf278bd5030f7f",
        "Q4_K_M": "95bdaf40c773cf90a95ef05dbab7dca91e87151730a66c147eba9b8b3afb45fa",
        "Q5_K_M": "75a9422cf4c50b7de83041589570b03895ec942d03fa6a9eba010e5154b0c302",
        "Q6_K": "b9f399625fffe857bc0b948d969ff9c397875ec121e9cb4a18746dae9ca14f7d",
        "Q8_0": "105099aadd321b088ff30282c3850d309e0953beaa72b1efd8baf24d54532de9",
    },
}
@pytest.fixture
def model(request, tiny_model: Path, odd_model: Path) -> Path:
    assert tiny_model.name == "tiny-v3"  # the name is in the golden files
    return {"tiny": tiny_model, "odd": odd_model}[request.param]


@pytest.mark.parametrize("model", ["tiny", "odd"], indirect=True)
@pytest.mark.parametrize("outtype", ["f16", "bf16"])
def test_convert_is_the_fork_converters_file(model: Path, outtype: str, tmp_path: Path) -> None:
    out = tmp_path / "first_class.gguf"
    r = convert_first_class(model, out, outtype)
    which = "tiny" if model.name == "tiny-v3" else "odd"
    assert sha256_file(out) == GOLDEN[which][outtype.upper()]
    n_vq = 32 if which == "tiny" else 4
    assert r.n_tensors == 11 * 2 + 3 + 2 * n_vq
    facts = check_first_class(out)
    assert (facts.n_vq, facts.n_layers) == (n_vq, 2)


@pytest.mark.parametrize("model", ["tiny", "odd"], indirect=True)
def test_quantized_are_the_fork_quantizers_files(model: Path, tmp_path: Path) -> None:
    """Four types and the f16 file from one read, each the fork's llama-quantize output."""
    which = "tiny" if model.name == "tiny-v3" else "odd"
    outputs = [(tmp_path / f"m_{t}.gguf", t) for t in TYPES]
    got = quantize_checkpoint(
        model, outputs, "f16", QuantizeSettings(), None, tmp_path, keep_intermediate=True,
        first_class=True,
    )  # fmt: skip
    assert [r.file_type for r in got.results] == TYPES
    for r in got.results:
        assert sha256_file(r.output) == GOLDEN[which][r.file_type], r.file_type
        check_first_class(r.output)
    assert sha256_file(got.intermediate) == GOLDEN[which]["F16"]
    fallbacks = got.results[0].fallbacks
    assert bool(fallbacks) == (which == "odd")  # llama.cpp's fallbacks, taken and reported
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"m_{t}.gguf" for t in TYPES] + ["moss-tts-delay_f16.gguf"]
    )  # no stand-in left behind


def test_names_and_keys_of_the_format(tiny_model: Path) -> None:
    plan = plan_first_class(tiny_model)
    names = [t.name for t in plan.tensors]
    assert "token_embd_audio.31.weight" in names and "output_audio.31.weight" in names
    assert "output.weight" in names and "token_embd_audio.32.weight" not in names
    by_source = {t.source.name: t.name for t in plan.tensors}
    assert by_source["lm_heads.1.weight"] == "output_audio.0.weight"
    assert by_source["lm_heads.0.weight"] == "output.weight"
    assert by_source["emb_ext.5.weight"] == "token_embd_audio.5.weight"
    # the qwen3 stand-in llama.cpp plans the quantization on: same tensors, qwen3 header
    stand_in = plan.dry_run_plan()
    assert stand_in.tensors == plan.tensors and stand_in.writer().arch == "qwen3"
    assert plan.writer().arch == "moss-tts-delay"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_all_writes_a_first_class_folder(tmp_path: Path) -> None:
    out = tmp_path / "w"
    done = cli("all", "--model", "builtin:tiny", "--output", str(out),
               "--format", "moss-tts-delay", "--quant", "Q4_K_M", "--quant", "F16")  # fmt: skip
    assert done.returncode == 0, done.stderr
    q4, f16 = out / "moss-tts-delay_q4_k_m.gguf", out / "moss-tts-delay_f16.gguf"
    assert sha256_file(q4) == GOLDEN["tiny"]["Q4_K_M"]
    assert sha256_file(f16) == GOLDEN["tiny"]["F16"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "moss-tts-delay"
    assert manifest["made_from"]["format"] == "moss-tts-delay"
    assert manifest["made_from"]["source"] == {"model": "builtin:tiny"}
    assert manifest["quant_types"] == {q4.name: "MOSTLY_Q4_K_M", f16.name: "MOSTLY_F16"}
    listed = {f["path"]: f for f in manifest["files"]}
    assert {"tokenizer/tokenizer.json", "audio_tokenizer/decoder.onnx"} <= set(listed)
    assert listed[q4.name]["sha256"] == GOLDEN["tiny"]["Q4_K_M"]
    # the model card: the fork's lines under the Hub's metadata, outside the manifest's files
    from test_model_card import checked_card

    card = checked_card(out)
    assert "first-class header checked" in card.text
    assert f"llama-moss-tts -m {q4.name} --print-delay-config" in card.text
    assert "llama-moss-tts" in done.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["w"]  # nothing staged is left
    again = cli("all", "--model", "builtin:tiny", "--output", str(out),
                "--format", "moss-tts-delay", "--quant", "Q4_K_M", "--quant", "F16")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    assert (out / "manifest.json").read_text() == json.dumps(manifest, indent=2) + "\n"
    checked = cli("verify", str(out), "--source", "builtin:tiny")
    assert checked.returncode == 0, checked.stdout
    assert "keys vs source" in checked.stdout and "first-class header" in checked.stdout
    other = cli("verify", str(out), "--source", "builtin:tiny-ttsd")  # n_vq 16: not its source
    assert other.returncode == 1 and "n_vq = 32, the source says 16" in " ".join(
        other.stdout.split()
    )
    q4.write_bytes(q4.read_bytes()[:-100])  # damaged after the fact: the manifest says so
    damaged = cli("verify", str(out))
    said = " ".join(damaged.stdout.split())
    assert damaged.returncode == 1 and "bytes, listed" in said and "truncated GGUF" in said


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*") if p.is_file()
    }  # fmt: skip


@pytest.mark.parametrize(
    "other, words",
    [
        (["--model", "builtin:tiny-ttsd"], "builtin:tiny; this run asks for builtin:tiny-ttsd"),
        (["--outtype", "bf16"], "outtype 'auto'"),
        (["--audio-tokenizer", "none"], "codec 'builtin'"),
    ],
)
def test_a_finished_folder_of_other_inputs_is_refused(other, words, tmp_path: Path) -> None:
    out = tmp_path / "w"
    base = ["all", "--output", str(out), "--format", "moss-tts-delay", "--quant", "Q8_0"]
    done = cli(*base, "--model", "builtin:tiny")
    assert done.returncode == 0, done.stderr
    before = _snapshot(out)
    args = other if other[0] == "--model" else ["--model", "builtin:tiny", *other]
    refused = cli(*base, *args)
    line = " ".join(refused.stderr.split())
    assert refused.returncode == 1 and str(out) in line and words in line, refused.stderr
    assert "--force" in line and "already complete" not in line
    assert _snapshot(out) == before and [p.name for p in tmp_path.iterdir()] == ["w"]
    again = cli(*base, "--model", "builtin:tiny")  # the same inputs: found complete
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr
    assert _snapshot(out) == before


def test_convert_cli_and_its_refusals(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    done = cli("convert", "builtin:tiny", "-o", str(out), "--format", "moss-tts-delay")
    assert done.returncode == 0, done.stderr
    assert sha256_file(out) == GOLDEN["tiny"]["F16"]
    refused = cli("convert", "builtin:tiny", "-o", str(tmp_path / "x.gguf"),
                  "--format", "moss-tts-delay", "--engine", "llama.cpp")  # fmt: skip
    assert refused.returncode == 2 and "native engine only" in refused.stderr
    unknown = cli("convert", "builtin:tiny", "-o", str(tmp_path / "x.gguf"), "--format", "gguf2")
    assert unknown.returncode == 2 and "unknown format 'gguf2'" in unknown.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def _damage(path: Path, how: str, tmp_path: Path) -> Path:
    """A copy of a first-class GGUF with one thing wrong, written with gguf's own writer."""
    import gguf

    if how == "truncated":
        bad = tmp_path / "truncated.gguf"
        bad.write_bytes(path.read_bytes()[: path.stat().st_size - 4096])
        return bad
    r = gguf_reader(path)
    bad = tmp_path / f"{how}.gguf"
    w = gguf.GGUFWriter(bad, "moss-tts-delay")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        value = f.contents()
        if f.name == "moss-tts-delay.n_vq" and how == "n_vq":
            value = 31
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, value, vtype, sub_type=sub)
    for t in r.tensors:
        if how == "head" and t.name == "output_audio.7.weight":
            continue
        w.add_tensor(t.name, t.data, raw_shape=list(reversed(t.shape.tolist())),
                     raw_dtype=t.tensor_type)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return bad


@pytest.mark.parametrize(
    "how, words",
    [
        ("n_vq", "n_vq = 31 but the file has 32 audio embeddings"),
        ("head", "n_vq = 32 but the file has 31 audio heads"),
        ("truncated", "truncated GGUF"),
    ],
)
def test_a_broken_first_class_file_is_refused(how, words, tiny_model, tmp_path) -> None:
    good = tmp_path / "good.gguf"
    convert_first_class(tiny_model, good, "f16")
    bad = _damage(good, how, tmp_path)
    with pytest.raises(InputError, match=words) as err:
        check_first_class(bad)
    assert Path(err.value.path) == bad and "\n" not in str(err.value)
    checked = cli("verify", str(bad))  # verify knows the format: a failing row, exit 1
    assert checked.returncode == 1 and "first-class header" in checked.stdout
    assert words.split()[0] in " ".join(checked.stdout.split())


def test_both_formats_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "w"
    done = cli("all", "--model", "builtin:tiny", "--output", str(out),
               "--format", "backend", "--format", "moss-tts-delay")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "backbone_q4_k_m.gguf").is_file() and (out / "moss-tts.yaml").is_file()
    first = out / "moss-tts-delay" / "moss-tts-delay_q4_k_m.gguf"
    assert sha256_file(first) == GOLDEN["tiny"]["Q4_K_M"]
    checked = cli("verify", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr


# the fork's llama-quantize with --tensor-type token_embd_audio=T --tensor-type output_audio=T
# on builtin:tiny's f16 file (commit and build as above), Q4_K_M
AUDIO_TABLES_GOLDEN = {
    "f16": "83cb72862a667bfac69ad160d3bd555eccf63fe3a66cdfc148c619a135755f90",
    "bf16": "cae12485d4c33a2d1766e2a08d7d5e92492fc5210c23c7dfd6f2229018a81413",
    "q8_0": "380ffbd7efd7a0006402fd8d69261e0b78a78008f4463b866d2038cc3e265655",
}


@pytest.mark.parametrize("tables", ["f16", "bf16", "q8_0"])
def test_audio_tables_type(tables: str, tmp_path: Path) -> None:
    out = tmp_path / "w"
    done = cli("all", "--model", "builtin:tiny", "--output", str(out), "--format",
               "moss-tts-delay", "--audio-tables-type", tables)  # fmt: skip
    assert done.returncode == 0, done.stderr
    q4 = out / "moss-tts-delay_q4_k_m.gguf"
    assert sha256_file(q4) == AUDIO_TABLES_GOLDEN[tables]
    from moss_gguf_cli.gguf.read import inspect_gguf

    types = {n: t.type for n, t in inspect_gguf(q4).tensors.items()}
    assert types["output_audio.3.weight"] == types["token_embd_audio.0.weight"] == tables.upper()
    assert types["blk.0.attn_q.weight"] == "Q4_K"
    assert json.loads((out / "manifest.json").read_text())["audio_tables_type"] == tables


def test_audio_tables_type_refusals(tmp_path: Path) -> None:
    bad = cli("all", "--model", "builtin:tiny", "--output", str(tmp_path / "w"), "--format",
              "moss-tts-delay", "--audio-tables-type", "q4_k")  # fmt: skip
    assert bad.returncode == 2 and "unknown audio tables type 'q4_k'" in bad.stderr
    alone = cli("all", "--model", "builtin:tiny", "--output", str(tmp_path / "w"),
                "--audio-tables-type", "f16")  # fmt: skip
    assert alone.returncode == 2 and "first-class format only" in alone.stderr
    assert list(tmp_path.iterdir()) == []
