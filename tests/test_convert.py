"""`convert`: parity of the native writer with llama.cpp's own converter, and that it runs.

Parity: for builtin:tiny, the native engine and llama.cpp's convert_hf_to_gguf.py (the pinned
tree of scripts/get-llama-cpp.sh, run through the llama.cpp engine) give GGUFs with the same
tensors (names, shapes, types, bytes) and the same metadata apart from descriptive general.*
keys, for every out type. It runs: llama.cpp (llama-cpp-python) loads the native GGUF and,
fed summed embeddings, computes the hidden states of a torch reference forward.
"""

from __future__ import annotations

import ctypes
import filecmp
import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import tiny_gguf
from gguf_reading import gguf_reader
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.errors import ToolError
from moss_gguf_cli.gguf.write import OutType
from moss_gguf_cli.pipeline.convert import (
    Converter,
    ConverterLogParser,
    build_convert_cmd,
    convert,
    converter_env,
    run_converter,
)
from moss_gguf_cli.progress import RecordingProgress
from moss_gguf_cli.source.checkpoint import open_checkpoint

REPO = Path(__file__).resolve().parents[1]
OUTTYPES = ["f16", "bf16", "f32", "q8_0"]
# general.* keys that describe rather than define the model (name, size label, type...)
DEFINING_GENERAL = {"general.architecture", "general.file_type", "general.quantization_version"}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ggufs")


@pytest.fixture(scope="session")
def native(builds, tiny_extracted: Path) -> dict[str, Path]:
    """Native GGUFs of every out type, from the whole extract output folder (shared builds)."""
    return {t: tiny_gguf(builds, tiny_extracted, t) for t in OUTTYPES}


@pytest.fixture(scope="session")
def llama(
    tiny_model: Path, tiny_extracted: Path, llama_tree: Path, ggufs: Path
) -> dict[str, tuple[Path, RecordingProgress]]:
    """llama.cpp's converter for every out type; f16 from the source (the engine extracts)."""
    out = {}
    for t in OUTTYPES:
        source = tiny_model if t == "f16" else tiny_extracted / "qwen3_backbone"
        rec = RecordingProgress()
        result = convert(
            source,
            ggufs / f"llama-{t}.gguf",
            outtype=t,
            engine="llama.cpp",
            llama_cpp=llama_tree,
            progress=rec,
        )
        out[t] = (result.outfile, rec)
    return out


# --------------------------------------------------------------------------- helpers


@functools.cache
def read_gguf(path: Path) -> tuple[dict, dict]:
    """(key → (value types, value), tensor name → (type, shape, sha256 of bytes)) of a GGUF.

    Cached: reading the 150k-token vocabulary takes seconds, and several tests read a file.
    """
    reader = gguf_reader(path)
    kv = {
        k: (tuple(int(t) for t in f.types), f.contents())
        for k, f in reader.fields.items()
        if not k.startswith("GGUF.")
    }
    tensors = {
        t.name: (
            t.tensor_type.name,
            tuple(int(x) for x in t.shape),
            hashlib.sha256(memoryview(np.ascontiguousarray(t.data)).cast("B")).hexdigest(),
        )
        for t in reader.tensors
    }
    return kv, tensors


def defining(kv: dict) -> dict:
    return {k: v for k, v in kv.items() if not k.startswith("general.") or k in DEFINING_GENERAL}


def no_partials(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".partial-" in p.name or ".extract-" in p.name]


def summed_embeddings(model: Path, n: int, seed: int = 7) -> np.ndarray:
    """MOSS-style backbone input: a text embedding plus one embedding per audio codebook."""
    ck = open_checkpoint(model)
    rng = np.random.default_rng(seed)
    text = rng.integers(0, ck.moss.vocab_size, n)
    codes = rng.integers(0, ck.moss.audio_rows, (n, ck.moss.n_vq))
    table = ck.tensors["language_model.embed_tokens.weight"]
    rows = np.stack([table.read_f32(int(t), int(t) + 1)[0] for t in text])
    for q in range(ck.moss.n_vq):
        ext = ck.tensors[f"emb_ext.{q}.weight"]
        rows += np.stack([ext.read_f32(int(c), int(c) + 1)[0] for c in codes[:, q]])
    return rows.astype(np.float32)


_LOG_SINK: list = []  # keeps the ctypes log callback alive as long as libllama may call it


@pytest.fixture(scope="module")
def quiet_llama():
    import llama_cpp

    if not _LOG_SINK:

        @llama_cpp.llama_log_callback
        def discard(level, text, user_data):  # noqa: ARG001
            pass

        _LOG_SINK.append(discard)
        llama_cpp.llama_log_set(discard, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return llama_cpp


def llama_hidden(llama_cpp, path: Path, embeds: np.ndarray) -> np.ndarray:
    """Final-norm hidden states llama.cpp computes for embeddings fed through batch.embd."""
    n, d = embeds.shape
    model = llama_cpp.llama_model_load_from_file(
        str(path).encode(), llama_cpp.llama_model_default_params()
    )
    assert model, f"llama.cpp could not load {path}"
    assert llama_cpp.llama_model_n_embd(model) == d
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
    cp.n_threads = cp.n_threads_batch = 2
    cp.embeddings = True
    cp.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
    # f32 KV cache and no flash attention: otherwise f16 intermediates bound the f32 accuracy
    cp.type_k = cp.type_v = llama_cpp.GGML_TYPE_F32
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(model, cp)
    batch = llama_cpp.llama_batch_init(n, d, 1)
    try:
        assert ctx
        batch.n_tokens = n
        flat = np.ascontiguousarray(embeds, dtype=np.float32).ravel()
        ctypes.memmove(batch.embd, flat.ctypes.data, flat.nbytes)
        for i in range(n):
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        assert llama_cpp.llama_decode(ctx, batch) == 0
        return np.stack(
            [
                np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(ctx, i), shape=(d,)).copy()
                for i in range(n)
            ]
        )
    finally:
        llama_cpp.llama_batch_free(batch)
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_parity_with_llama_cpp(outtype: str, native, llama) -> None:
    nat_kv, nat_t = read_gguf(native[outtype])
    ll_kv, ll_t = read_gguf(llama[outtype][0])
    assert set(nat_t) == set(ll_t)
    for name in ll_t:
        n_type, n_shape, n_bytes = nat_t[name]
        l_type, l_shape, l_bytes = ll_t[name]
        assert (n_type, n_shape) == (l_type, l_shape), name
        assert n_bytes == l_bytes, f"{name}: tensor bytes differ"
    nat_def, ll_def = defining(nat_kv), defining(ll_kv)
    assert set(nat_def) == set(ll_def)
    for key in ll_def:
        assert nat_def[key] == ll_def[key], key


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_tensor_types_follow_llama_cpp_rules(outtype: str, native) -> None:
    _, tensors = read_gguf(native[outtype])
    want = OutType(outtype).qtype.name
    assert len(tensors) == 2 * 11 + 3
    for name, (qtype, shape, _) in tensors.items():
        flat = len(shape) == 1 or name.endswith("_norm.weight")
        assert qtype == ("F32" if flat else want), name


def test_tokenizer_metadata(native, tiny_model: Path) -> None:
    kv, _ = read_gguf(native["f16"])
    tokens = kv["tokenizer.ggml.tokens"][1]
    types = kv["tokenizer.ggml.token_type"][1]
    assert kv["tokenizer.ggml.model"][1] == "gpt2"
    assert kv["tokenizer.ggml.pre"][1] == "qwen2"
    assert len(tokens) == len(types) == 151936  # padded to the model's vocab
    assert tokens[151669] == "[PAD151669]" and types[151669] == gguf.TokenType.UNUSED
    assert tokens[151644] == "<|im_start|>" and types[151644] == gguf.TokenType.CONTROL
    assert tokens[151667] == "<think>" and types[151667] == gguf.TokenType.USER_DEFINED
    assert kv["tokenizer.ggml.eos_token_id"][1] == 151645
    assert kv["tokenizer.ggml.add_bos_token"][1] is False
    template = json.loads((tiny_model / "tokenizer_config.json").read_text())["chat_template"]
    assert kv["tokenizer.chat_template"][1] == template


def test_special_token_ids_come_from_the_backbone_config(tmp_path: Path) -> None:
    """A MOSS source folder's config.json is the MOSS config: the ids written come from the
    backbone config given (through gguf-py's private SpecialVocab hook, see gguf_vocab)."""
    from moss_gguf_cli.gguf.vocab import read_vocab
    from moss_gguf_cli.source.tiny import tokenizer_source

    for f in tokenizer_source().iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 7, "eos_token_id": 8}))
    vocab = read_vocab(tmp_path, {"bos_token_id": 151643, "eos_token_id": 9}, 151936)
    ids = vocab.special.special_token_ids
    assert ids["bos"] == 151643  # the backbone config's, not config.json's 7
    assert ids["eos"] == 151645  # tokenizer_config's eos_token wins over either config


@pytest.mark.parametrize("change", ["missing", "signature"])
def test_gguf_without_the_special_vocab_hook_is_refused(change, monkeypatch) -> None:
    """A gguf release that renames or reshapes the private methods we override is refused,
    not used with the MOSS config's token ids."""
    from moss_gguf_cli.gguf.vocab import read_vocab
    from moss_gguf_cli.source.tiny import tokenizer_source

    if change == "missing":
        monkeypatch.delattr(gguf.SpecialVocab, "_try_load_from_config_json")
    else:
        monkeypatch.setattr(gguf.SpecialVocab, "_set_special_token", lambda self, typ, tid, n: 0)
    with pytest.raises(ToolError, match="SpecialVocab"):
        read_vocab(tokenizer_source(), {}, 151936)


def test_native_from_source_and_backbone_identical(tiny_model, tiny_extracted, native, tmp_path):
    """From the source shards, the extract folder or the backbone folder: the same bytes."""
    a = convert(tiny_model, tmp_path / "src.gguf", outtype="f16")
    b = convert(tiny_extracted / "qwen3_backbone", tmp_path / "bb.gguf", outtype="f16")
    assert a.source_kind == "moss" and b.source_kind == "backbone"
    assert filecmp.cmp(a.outfile, native["f16"], shallow=False)
    assert filecmp.cmp(b.outfile, native["f16"], shallow=False)


def test_plain_and_write_behind_writes_agree(tiny_extracted, native, tmp_path, monkeypatch):
    """Outputs below the sinks' threshold are plain buffered writes; the bytes are the same
    as through the write-behind sink that the tiny f16 GGUF (≈ 90 MB) gets."""
    import functools

    from moss_gguf_cli.disk import sinks
    from moss_gguf_cli.gguf import write as gguf_write

    assert native["f16"].stat().st_size > sinks.DIRECT_MIN_BYTES
    monkeypatch.setattr(
        gguf_write, "appender", functools.partial(sinks.appender, min_direct=1 << 62)
    )
    out = convert(tiny_extracted, tmp_path / "buffered.gguf", outtype="f16").outfile
    assert filecmp.cmp(out, native["f16"], shallow=False)


def test_llama_cpp_engine_progress_and_cleanup(llama, ggufs: Path) -> None:
    path, rec = llama["f16"]
    assert rec.done["convert:tensors"] == rec.totals["convert:tensors"] == 25
    assert 0 < rec.done["convert:bytes"] <= rec.totals["convert:bytes"]
    assert rec.done["convert:bytes"] >= 0.99 * rec.totals["convert:bytes"]
    assert "total" in rec.totals  # the source was extracted first ...
    assert no_partials(ggufs) == []  # ... into a temporary folder that is gone


def test_native_progress_by_bytes_and_tensor(tiny_extracted: Path, tmp_path: Path) -> None:
    rec = RecordingProgress()
    convert(tiny_extracted, tmp_path / "p.gguf", outtype="bf16", progress=rec)
    assert rec.done["convert:tensors"] == rec.totals["convert:tensors"] == 25
    assert rec.done["convert:bytes"] == rec.totals["convert:bytes"]
    named = {e[3] for e in rec.events if e[0] == "advance" and e[1] == "convert:tensors"}
    assert "blk.1.ffn_down.weight" in named


# --------------------------------------------------------------------------- it runs


@pytest.mark.parametrize(("outtype", "tolerance"), [("f32", 1e-4), ("f16", 1e-2)])
def test_hidden_state_matches_reference(outtype, tolerance, native, tiny_model, quiet_llama):
    from moss_gguf_cli.verify.reference import forward, load_weights

    embeds = summed_embeddings(tiny_model, 6)
    want = forward(load_weights(tiny_model), embeds)
    got = llama_hidden(quiet_llama, native[outtype], embeds)
    assert got.shape == want.shape
    rel = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert rel.max() <= tolerance, rel


def test_reference_logits_use_lm_head(tiny_extracted: Path, tiny_model: Path) -> None:
    from moss_gguf_cli.verify.reference import forward, load_weights

    embeds = summed_embeddings(tiny_model, 3)
    w = load_weights(tiny_extracted)
    hidden, logits = forward(w, embeds, logits=True)
    head = w["lm_head.weight"].numpy()
    assert logits.shape == (3, 151936)
    np.testing.assert_allclose(logits, hidden.astype(np.float64) @ head.T, rtol=1e-4, atol=1e-4)
    # causal: the first position does not see the later ones
    first = forward(w, embeds[:1])
    np.testing.assert_allclose(first[0], hidden[0], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- bad input

runner = CliRunner()


def cli(*args: str):
    return runner.invoke(app, ["convert", *args])


def one_line_error(result) -> str:
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error:"), result.output
    return lines[0]


def backbone_copy(tiny_extracted: Path, dest: Path, *, link_weights: bool = True) -> Path:
    """A backbone folder beside the test: small files copied, weights hard-linked (a symlink
    out of the folder would be refused) or copied."""
    src = tiny_extracted / "qwen3_backbone"
    dest.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors" and link_weights:
            os.link(f, dest / f.name)
        else:
            shutil.copyfile(f, dest / f.name)
    return dest


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("damage", "message", "code"),
    [
        ("no-config", "config.json is missing", 2),
        ("no-tokenizer", "tokenizer file tokenizer.json is missing", 2),
        ("llama-arch", "architecture LlamaForCausalLM is neither Qwen3ForCausalLM nor MOSS", 2),
        ("missing-tensor", "tensor 'model.layers.2.input_layernorm.weight' is missing", 2),
        ("extra-tensor", "unexpected tensor 'model.layers.1.", 2),
        ("wrong-shape", "'model.layers.0.mlp.gate_proj.weight' has shape [768, 256] but", 2),
    ],
)
def test_bad_input(damage, message, code, tiny_extracted, tmp_path) -> None:
    folder = backbone_copy(tiny_extracted, tmp_path / "backbone")
    if damage == "no-config":
        (folder / "config.json").unlink()
    elif damage == "no-tokenizer":
        (folder / "tokenizer.json").unlink()
    elif damage == "llama-arch":
        edit_config(folder, architectures=["LlamaForCausalLM"], model_type="llama")
    elif damage == "missing-tensor":
        edit_config(folder, num_hidden_layers=3)
    elif damage == "extra-tensor":
        edit_config(folder, num_hidden_layers=1)
    elif damage == "wrong-shape":
        edit_config(folder, intermediate_size=512)
    out = tmp_path / "out" / "model.gguf"
    result = cli(str(folder), "--outfile", str(out))
    assert result.exit_code == code, result.output
    assert message in one_line_error(result)
    assert not out.exists()
    assert not out.parent.exists() or no_partials(out.parent) == []


def test_moss_lookalike_is_refused(tmp_path: Path) -> None:
    from moss_gguf_cli.source.tiny import ensure_tiny

    result = cli(str(ensure_tiny("tiny-local")), "--outfile", str(tmp_path / "x.gguf"))
    assert result.exit_code == 2
    assert "not a delay model" in one_line_error(result)


def test_existing_outfile_needs_force(tiny_extracted: Path, native, tmp_path: Path) -> None:
    out = tmp_path / "model.gguf"
    out.write_bytes(b"keep me")
    result = cli(str(tiny_extracted), "--outfile", str(out))
    assert result.exit_code == 1
    assert "output file exists" in one_line_error(result)
    assert "--force" in result.output
    assert out.read_bytes() == b"keep me"
    forced = cli(str(tiny_extracted), "--outfile", str(out), "--outtype", "bf16", "--force", "-q")
    assert forced.exit_code == 0, forced.output
    assert forced.output.strip() == str(out)
    assert filecmp.cmp(out, native["bf16"], shallow=False)
    assert no_partials(tmp_path) == []


def test_unwritable_outfile(tiny_extracted: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = cli(str(tiny_extracted), "--outfile", str(blocker / "model.gguf"))
    assert result.exit_code == 1
    assert "is not a folder" in one_line_error(result)
    folder_out = tmp_path / "a-folder"
    folder_out.mkdir()
    result = cli(str(tiny_extracted), "--outfile", str(folder_out), "--force")
    assert result.exit_code == 1
    assert "is a folder" in one_line_error(result)


@pytest.mark.parametrize(("flag", "value"), [("--outtype", "q4_k_m"), ("--engine", "torch")])
def test_unknown_choice(flag: str, value: str, tiny_extracted: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.gguf"
    result = cli(str(tiny_extracted), "--outfile", str(out), flag, value)
    assert result.exit_code == 2
    assert value in one_line_error(result)
    assert not out.exists()


def poke_bf16(folder: Path, tensor: str, value_bits: int) -> None:
    """Overwrite the first element of a bf16 tensor in the folder's model.safetensors."""
    from moss_gguf_cli.source.safetensors_io import read_header

    path = folder / "model.safetensors"
    info = read_header(path).tensors[tensor]
    with open(path, "r+b") as f:
        f.seek(info.offset)
        f.write(np.array([value_bits], dtype="<u2").tobytes())


def test_f16_overflow_is_refused(tiny_extracted: Path, tmp_path: Path) -> None:
    folder = backbone_copy(tiny_extracted, tmp_path / "backbone", link_weights=False)
    poke_bf16(folder, "model.layers.1.mlp.up_proj.weight", 0x4780)  # 65536.0
    out = tmp_path / "model.gguf"
    result = cli(str(folder), "--outfile", str(out), "--outtype", "f16")
    assert result.exit_code == 1
    line = one_line_error(result)
    assert "model.layers.1.mlp.up_proj.weight" in line and "float16 range" in line
    assert "--outtype bf16" in line
    assert not out.exists() and no_partials(tmp_path) == []
    # the largest bf16 below the f16 limit still converts, and bf16 takes the big value
    assert cli(str(folder), "--outfile", str(out), "-t", "bf16").exit_code == 0
    poke_bf16(folder, "model.layers.1.mlp.up_proj.weight", 0x477F)  # 65280.0
    assert cli(str(folder), "--outfile", str(out), "-t", "f16", "--force").exit_code == 0


def test_nan_in_source_is_refused(tiny_extracted: Path, tmp_path: Path) -> None:
    folder = backbone_copy(tiny_extracted, tmp_path / "backbone", link_weights=False)
    poke_bf16(folder, "model.norm.weight", 0x7FC0)
    result = cli(str(folder), "--outfile", str(tmp_path / "m.gguf"), "-t", "f32")
    assert result.exit_code == 1
    assert "'model.norm.weight' holds NaN or Inf" in one_line_error(result)


# --------------------------------------------------------------------------- llama.cpp engine


def test_missing_llama_tree(tiny_extracted: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "model.gguf"
    result = cli(str(tiny_extracted), "--outfile", str(out), "--engine", "llama.cpp",
                 "--llama-cpp", str(empty))  # fmt: skip
    assert result.exit_code == 1
    assert "convert_hf_to_gguf.py" in one_line_error(result)
    assert not out.exists()


def test_converter_failure_is_one_line(llama_tree: Path, tiny_extracted: Path, tmp_path):
    """The real converter failing (an architecture it does not know) → its last lines."""
    folder = backbone_copy(tiny_extracted, tmp_path / "backbone")
    edit_config(folder, architectures=["MossNotARealModelForCausalLM"])
    with pytest.raises(ToolError) as err:
        run_converter(
            llama_tree / "convert_hf_to_gguf.py", llama_tree / "gguf-py", folder,
            tmp_path / "x.gguf", OutType.F16, 25, 1,
        )  # fmt: skip
    line = err.value.one_line()
    assert "convert_hf_to_gguf.py failed (exit 1)" in line
    assert "MossNotARealModelForCausalLM" in line
    assert "\n" not in line


def test_build_convert_cmd_and_env(tmp_path: Path) -> None:
    cmd = build_convert_cmd("/t/convert_hf_to_gguf.py", "/m", "/o.gguf", "q8_0", python="py")
    assert cmd == ["py", "/t/convert_hf_to_gguf.py", "/m", "--outfile", "/o.gguf",
                   "--outtype", "q8_0"]  # fmt: skip
    env = converter_env(tmp_path / "gguf-py", {"PYTHONPATH": "/x", "NO_LOCAL_GGUF": "1"})
    assert env["PYTHONPATH"] == f"{tmp_path / 'gguf-py'}{os.pathsep}/x"
    assert "NO_LOCAL_GGUF" not in env
    assert Converter.parse("llama_cpp") is Converter.LLAMA_CPP


def test_converter_log_parser_reads_pieces_and_missing_modules() -> None:
    rec = RecordingProgress()
    p = ConverterLogParser(rec, n_tensors=2, total_bytes=1000)
    text = (
        "INFO:hf-to-gguf:output.weight,            torch.bfloat16 --> F16, shape = {256, 9}\n"
        "INFO:hf-to-gguf:blk.0.attn_norm.weight,   torch.bfloat16 --> F32, shape = {256}\n"
        "Writing:   0%|          | 0.00/1.0k [00:00<?, ?byte/s]\rWriting:  49%|####9 | 490/1k"
        "\rWriting: 100%|##########| 1.0k/1.0k\n"
        "ModuleNotFoundError: No module named 'sentencepiece'\n"
    )
    for i in range(0, len(text), 7):  # arbitrary pieces, as a pipe delivers them
        p.feed(text[i : i + 7])
    p.close()
    assert p.types == {"F16": 1, "F32": 1}
    assert rec.done["convert:tensors"] == 2
    assert rec.done["convert:bytes"] == 1000
    assert p.missing_module == "sentencepiece"
