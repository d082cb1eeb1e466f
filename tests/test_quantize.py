"""`quantize` with the real llama.cpp: byte identity with llama-quantize, the log parser on
real output, every bad input, Ctrl-C, and the CLI.

The llama.cpp tree is $LLAMA_CPP_DIR, else the one scripts/get-llama-cpp.sh builds (cached
outside the repo, minutes the first time, instant after).
"""

from __future__ import annotations

import filecmp
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import QUANT_TYPES
from gguf_reading import gguf_reader
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.errors import InputError, OutputError, ToolError, UsageError
from moss_gguf_cli.gguf.file_types import file_type_table, parse_file_type
from moss_gguf_cli.native import llama_tools as lc
from moss_gguf_cli.native.pins import LLAMA_CPP_PYTHON
from moss_gguf_cli.progress import RecordingProgress
from moss_gguf_cli.quantize.llama import (
    inspect_gguf,
    load_imatrix,
    output_name,
    plan_quantize,
    quantize,
)

REPO = Path(__file__).resolve().parents[1]
TYPES = QUANT_TYPES
runner = CliRunner()



# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def tiny_f16(tiny_f16_gguf: Path) -> Path:
    """builtin:tiny as an f16 GGUF by our converter (the run's shared build)."""
    return tiny_f16_gguf


@pytest.fixture(scope="session")
def references(tiny_llama_quantized: dict[str, Path]) -> dict[str, Path]:
    """llama-quantize run directly, not through moss-gguf (the run's shared builds)."""
    return tiny_llama_quantized


def write_small_gguf(path: Path, *, arch: str = "qwen3", hidden: int = 64, ff: int = 48) -> Path:
    """A one-layer Qwen3 GGUF whose rows are too short for K-quants (real fallbacks);
    ff=48 is not even a multiple of 32, so ffn_down must stay F16."""
    heads, kv, head_dim, vocab = 2, 1, 32, 512
    rng = np.random.default_rng(0)

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", mat(vocab, hidden))
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor(p + "attn_q.weight", mat(heads * head_dim, hidden))
    w.add_tensor(p + "attn_k.weight", mat(kv * head_dim, hidden))
    w.add_tensor(p + "attn_v.weight", mat(kv * head_dim, hidden))
    w.add_tensor(p + "attn_output.weight", mat(hidden, heads * head_dim))
    w.add_tensor(p + "attn_q_norm.weight", np.ones(head_dim, np.float32))
    w.add_tensor(p + "attn_k_norm.weight", np.ones(head_dim, np.float32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor(p + "ffn_gate.weight", mat(ff, hidden))
    w.add_tensor(p + "ffn_up.weight", mat(ff, hidden))
    w.add_tensor(p + "ffn_down.weight", mat(hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def small_f16(tmp_path_factory) -> Path:
    return write_small_gguf(tmp_path_factory.mktemp("small") / "small_f16.gguf")


def run_binary(exe: Path, *args: str | Path) -> str:
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


def gguf_tensor_types(path: Path) -> dict[str, str]:
    # our header reader: gguf.GGUFReader takes seconds on a 152k-token vocabulary
    return {t.name: t.type for t in inspect_gguf(path).tensors.values()}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name)


# ----------------------------------------------------------------------------- the script


def test_tree_is_pinned_and_same_llama_cpp_as_the_library(llama_tree: Path, quantize_bin: Path):
    assert (llama_tree / lc.CONVERT_SCRIPT).is_file()
    assert (llama_tree / "gguf-py" / "gguf").is_dir()
    found = lc.find_llama_cpp(llama_tree)
    assert found.root == llama_tree and found.quantize_bin == quantize_bin
    assert found.convert_script == llama_tree / lc.CONVERT_SCRIPT
    tree, lib = lc.tree_version(llama_tree), lc.library_version()
    assert lib is not None and tree.commit and lib.commit
    # byte identity needs one llama.cpp: the tree the binary is built from and libllama
    assert tree.same_commit(lib), f"{tree.describe()} vs {lib.describe()}"
    assert tree.llama_version == (lib.llama_version or "").split("-")[0]
    assert tree.ggml_version == lib.ggml_version


def test_get_llama_cpp_script_second_run_is_a_no_op(llama_tree: Path):
    pin = llama_tree / lc.PIN_FILE
    assert pin.is_file(), "the tree should come from scripts/get-llama-cpp.sh"
    version = dict(line.split("=", 1) for line in pin.read_text().splitlines())
    assert version["llama_cpp_python"] == LLAMA_CPP_PYTHON  # the one pin
    env = {k: v for k, v in os.environ.items() if k != "MOSS_GGUF_CACHE"}
    env["MOSS_GGUF_CACHE"] = str(llama_tree.parent)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "get-llama-cpp.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(llama_tree)
    assert "building" not in done.stderr and "configuring" not in done.stderr
    assert (llama_tree / ".moss-gguf-built").is_file()
    # the build recorded the real commit (llama.cpp's build-info reads the tree's git)
    out = subprocess.run(
        [str(lc.find_quantize_binary(llama_tree)), str(llama_tree / "missing.gguf"), "Q8_0"],
        capture_output=True,
        text=True,
    )
    assert f"commit {version['llama_cpp_commit'][:7]}" in out.stdout + out.stderr


# ----------------------------------------------------------------------------- byte identity


@pytest.mark.parametrize("engine", ["binary", "library"])
def test_engines_are_byte_identical_to_llama_quantize(
    engine: str, tiny_f16: Path, references: dict[str, Path], llama_tree: Path, tmp_path: Path
):
    progress = RecordingProgress()
    results = quantize(
        tiny_f16, types=TYPES, output_dir=tmp_path, engine=engine, llama_cpp=llama_tree,
        progress=progress,
    )  # fmt: skip
    assert [r.file_type for r in results] == TYPES
    n_tensors = inspect_gguf(tiny_f16).n_tensors
    commit = (lc.tree_version(llama_tree).commit or "?")[:7]
    for t, r in zip(TYPES, results, strict=True):
        assert r.output == tmp_path / f"backbone_{t.lower()}.gguf"
        assert filecmp.cmp(r.output, references[t], shallow=False), f"{engine} {t} differs"
        assert r.engine == engine and commit in (r.llama_cpp or "")
        assert r.output_bytes == r.output.stat().st_size
        assert r.input_bytes == tiny_f16.stat().st_size
        # the rows parsed from the live log describe the file that was written
        actual = gguf_tensor_types(r.output)
        assert len(r.tensors) == n_tensors == len(actual)
        assert {row.name: row.dst_type.upper() for row in r.tensors} == actual
        assert [row.index for row in r.tensors] == list(range(1, n_tensors + 1))
        assert r.fallbacks == []
        header = inspect_gguf(r.output)
        n_bits = sum(x.n_bytes for x in header.tensors.values()) * 8
        assert r.bpw == pytest.approx(n_bits / header.n_elements, abs=0.006)
        assert r.input_bpw == pytest.approx(16.0, abs=0.1)
        assert header.file_type == file_type_table()[t]
        key = f"quantize:{t}"
        assert progress.totals[key] == n_tensors and progress.done[key] == n_tensors
    q4 = {row.name: row for row in results[0].tensors}
    assert q4["output.weight"].dst_type == "q6_K" and q4["blk.0.attn_q.weight"].dst_type == "q4_K"
    assert q4["output_norm.weight"].converted is False
    assert q4["blk.0.ffn_down.weight"].shape == (768, 256, 1, 1)


# ----------------------------------------------------------------------------- the parser


def test_parser_on_real_llama_quantize_output(small_f16: Path, quantize_bin: Path, tmp_path):
    out = tmp_path / "q.gguf"
    text = run_binary(quantize_bin, small_f16, out, "Q4_K_M")
    p = lc.parse_quantize_log(text)
    assert len(p.rows) == p.total == 14
    fb = {f.name: f for f in p.fallbacks}
    assert len(fb) == p.n_fallback == 8
    assert (fb["token_embd.weight"].wanted_type, fb["token_embd.weight"].used_type) == (
        "q4_K",
        "q5_0",
    )
    down = fb["blk.0.ffn_down.weight"]
    assert down.unusual_shape and down.used_type == "f16" and down.ncols == 48
    assert (
        not fb["blk.0.attn_v.weight"].unusual_shape and fb["blk.0.attn_v.weight"].block_size == 256
    )
    assert {r.name: r.dst_type.upper() for r in p.rows} == gguf_tensor_types(out)
    rows = {r.name: r for r in p.rows}
    assert rows["blk.0.ffn_down.weight"].converted is False  # already f16: copied
    assert rows["token_embd.weight"].src_mib == pytest.approx(0.06)
    assert p.model_bpw == pytest.approx(16.05) and p.quant_bpw is not None and p.quant_bpw < 8
    assert p.build is not None and p.build.build_number is not None and p.build.commit
    assert p.quantize_ms is not None and p.error is None

    # any split of the stream gives the same result, with events in order
    rng = random.Random(1)
    q = lc.QuantizeLogParser()
    events: list = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 40)
        events += q.feed(text[i : i + n])
        i += n
    events += q.close()
    assert [r.name for r in q.rows] == [r.name for r in p.rows]
    assert len(q.fallbacks) == 8
    started = [e.name for e in events if isinstance(e, lc.TensorStarted)]
    done = [e.row.name for e in events if isinstance(e, lc.TensorDone)]
    assert started == done == [r.name for r in p.rows]
    conv = [e for e in events if isinstance(e, lc.TensorConverting)]
    assert len(conv) == sum(r.converted for r in p.rows)
    order = [type(e).__name__ for e in events if getattr(e, "name", "") == "token_embd.weight"]
    assert order == ["TensorStarted", "TensorConverting"]


def test_library_engine_reports_the_same_fallbacks(small_f16: Path, llama_tree: Path, tmp_path):
    b, lib = (
        quantize(small_f16, tmp_path / f"{e}.gguf", "Q4_K_M", engine=e, llama_cpp=llama_tree)[0]
        for e in ("binary", "library")
    )
    assert filecmp.cmp(b.output, lib.output, shallow=False)
    assert [(f.name, f.used_type) for f in lib.fallbacks] == [
        (f.name, f.used_type) for f in b.fallbacks
    ]
    assert len(lib.fallbacks) == 8 and lib.tensors == b.tensors


def test_parser_failure_line():
    text = (
        "llama_model_quantize: failed to quantize: requantizing from type q8_0 is disabled\n"
        "llama_quantize: failed to quantize model from 'x.gguf'\n"
    )
    assert lc.parse_quantize_log(text).error == "requantizing from type q8_0 is disabled"


# ----------------------------------------------------------------------------- imatrix


def write_imatrix_gguf(path: Path, entries: dict[str, np.ndarray], counts: dict[str, float]):
    w = gguf.GGUFWriter(str(path), "imatrix")
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["calibration.txt"])
    w.add_uint32("imatrix.chunk_count", 7)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, values in entries.items():
        w.add_tensor(name + ".in_sum2", values.astype(np.float32))
        w.add_tensor(name + ".counts", np.array([counts[name]], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_imatrix_legacy(path: Path, entries: dict[str, np.ndarray], ncall: int):
    with open(path, "wb") as fh:
        fh.write(struct.pack("<i", len(entries)))
        for name, values in entries.items():
            fh.write(struct.pack("<i", len(name)) + name.encode())
            fh.write(struct.pack("<ii", ncall, values.size))
            fh.write((values.astype(np.float32) * ncall).tobytes())
        fh.write(struct.pack("<i", 3) + struct.pack("<i", 5) + b"wiki2")


@pytest.mark.parametrize("kind", ["gguf", "legacy"])
def test_imatrix_is_byte_identical_in_both_engines(
    kind: str, small_f16: Path, quantize_bin: Path, llama_tree: Path, tmp_path: Path
):
    rng = np.random.default_rng(3)
    names = ["blk.0.attn_q.weight", "blk.0.ffn_up.weight", "token_embd.weight"]
    entries = {n: rng.uniform(0.1, 50.0, 64).astype(np.float32) for n in names}
    imatrix = tmp_path / f"imatrix.{kind}"
    if kind == "gguf":
        write_imatrix_gguf(imatrix, entries, {n: 40.0 for n in names})
    else:
        write_imatrix_legacy(imatrix, entries, ncall=4)
    data = load_imatrix(imatrix)
    assert set(data.entries) == set(names) and data.chunk_count in (7, 3)

    ref = tmp_path / "ref.gguf"
    text = run_binary(quantize_bin, "--imatrix", imatrix, small_f16, ref, "Q4_0")
    plain = tmp_path / "plain.gguf"
    run_binary(quantize_bin, small_f16, plain, "Q4_0")
    assert not filecmp.cmp(ref, plain, shallow=False)  # the matrix was used
    for engine in ("binary", "library"):
        r = quantize(
            small_f16, tmp_path / f"{engine}.gguf", "Q4_0", engine=engine, llama_cpp=llama_tree,
            imatrix=imatrix,
        )[0]  # fmt: skip
        assert filecmp.cmp(r.output, ref, shallow=False), engine
        notes = {row.name: row.notes for row in r.tensors}
        assert any("did not find weights" in n for n in notes["blk.0.attn_k.weight"])
        assert notes["blk.0.attn_q.weight"] == []
    assert "did not find weights for blk.0.attn_k.weight" in text
    assert gguf_reader(ref).fields["quantize.imatrix.entries_count"].contents() == 3


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("engine", ["binary", "library"])
def test_bad_imatrix(engine: str, small_f16: Path, llama_tree: Path, tmp_path: Path):
    kw = dict(engine=engine, llama_cpp=llama_tree)
    with pytest.raises(InputError, match="importance matrix file not found"):
        quantize(small_f16, tmp_path / "o.gguf", "Q4_0", imatrix=tmp_path / "none.dat", **kw)
    junk = tmp_path / "junk.dat"
    junk.write_bytes(b"\x05\x00\x00\x00" + b"\xff" * 30)
    with pytest.raises(InputError, match="importance matrix"):
        quantize(small_f16, tmp_path / "o.gguf", "Q4_0", imatrix=junk, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.dat"]


def test_not_a_gguf(tmp_path: Path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a gguf" * 10)
    with pytest.raises(InputError, match="not a GGUF") as e:
        quantize(bad, tmp_path / "out.gguf", "Q4_K_M")
    assert "model.gguf" in e.value.one_line()
    with pytest.raises(InputError, match="not found"):
        quantize(tmp_path / "missing.gguf", tmp_path / "out.gguf", "Q4_K_M")
    assert leftovers(tmp_path) == [] and not (tmp_path / "out.gguf").exists()


def test_truncated_gguf(small_f16: Path, tmp_path: Path):
    data = small_f16.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:-100])
    with pytest.raises(InputError, match="truncated GGUF: .* tensor data needs"):
        quantize(short, tmp_path / "out.gguf", "Q8_0")
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:200])
    with pytest.raises(InputError, match="header ends early"):
        quantize(head, tmp_path / "out.gguf", "Q8_0")
    assert not (tmp_path / "out.gguf").exists() and leftovers(tmp_path) == []


def test_output_equal_to_input(small_f16: Path, tmp_path: Path, monkeypatch):
    copy = tmp_path / "m.gguf"
    shutil.copy(small_f16, copy)
    before = copy.read_bytes()
    monkeypatch.chdir(tmp_path)
    for out in (copy, Path("m.gguf"), tmp_path / "." / "m.gguf"):
        with pytest.raises(UsageError, match="output path is the input"):
            quantize(copy, out, "Q8_0", force=True)
    assert copy.read_bytes() == before


def test_already_quantized_needs_allow_requantize(
    small_f16: Path, quantize_bin: Path, llama_tree: Path, tmp_path: Path
):
    q8 = tmp_path / "small_q8_0.gguf"
    run_binary(quantize_bin, small_f16, q8, "Q8_0")
    with pytest.raises(InputError, match="already quantized .*q8_0|already quantized .*Q8_0") as e:
        quantize(q8, tmp_path / "again.gguf", "Q4_0", llama_cpp=llama_tree)
    assert "--allow-requantize" in e.value.one_line()
    ref = tmp_path / "ref.gguf"
    run_binary(quantize_bin, "--allow-requantize", q8, ref, "Q4_0")
    for engine in ("binary", "library"):
        r = quantize(
            q8, tmp_path / f"{engine}.gguf", "Q4_0", engine=engine, llama_cpp=llama_tree,
            allow_requantize=True,
        )[0]  # fmt: skip
        assert filecmp.cmp(r.output, ref, shallow=False)


def test_unknown_types_list_the_valid_ones(small_f16: Path, tmp_path: Path):
    with pytest.raises(UsageError) as e:
        quantize(small_f16, tmp_path / "o.gguf", "Q4_K_XL")
    line = e.value.one_line()
    assert "Q4_K_XL" in line
    for name in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "IQ4_XS", "F16", "BF16"):
        assert name in line
    with pytest.raises(UsageError, match="unknown tensor type"):
        quantize(small_f16, tmp_path / "o.gguf", "Q8_0", token_embedding_type="q9_9")
    with pytest.raises(UsageError, match="2 types but 1 output") as e:
        quantize(small_f16, tmp_path / "o.gguf", ["Q8_0", "Q6_K"])
    assert "--output-dir" in e.value.one_line()
    assert not (tmp_path / "o.gguf").exists()


def test_type_table_covers_llama_cpp(quantize_bin: Path):
    table = file_type_table()
    import llama_cpp

    consts = {k for k in dir(llama_cpp) if k.startswith("LLAMA_FTYPE_")} - {"LLAMA_FTYPE_GUESSED"}
    assert {table[k.split("_", 3)[-1]] if "MOSTLY" in k else table["F32"] for k in consts} == {
        getattr(llama_cpp, k) for k in consts
    }
    assert {m.value for m in gguf.LlamaFileType if m.name != "GUESSED"} <= set(table.values())
    # every type llama-quantize itself lists
    usage = subprocess.run([str(quantize_bin)], capture_output=True, text=True)
    listed = re.findall(r"^\s+(?:\d+\s+or\s+)?([A-Z0-9_]+)\s+:", usage.stdout, re.M)
    assert "Q4_K_M" in listed
    for name in listed:
        if name != "COPY":
            assert parse_file_type(name.lower()) in table
    for name in ("q4_k_m", "Q4_k_M", "iq2_xxs", "bf16", "F16", "q4_k"):
        assert parse_file_type(name) in table
    assert parse_file_type("q4_k") == "Q4_K_M"


def test_no_engine_available_says_how_to_get_one(small_f16: Path, tmp_path: Path):
    # a real process where llama-cpp-python cannot be imported and nothing is on PATH
    shadow = tmp_path / "shadow" / "llama_cpp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(shadow.parent), PATH=str(empty_bin))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "moss_gguf_cli",
            "quantize",
            str(small_f16),
            str(tmp_path / "o.gguf"),
        ]
        + ["Q8_0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "no quantize engine" in done.stderr
    assert (
        "scripts/get-llama-cpp.sh" in done.stderr and "llama-cpp-python==" in done.stderr
    )
    assert "Traceback" not in done.stderr and not (tmp_path / "o.gguf").exists()


def test_binary_engine_without_a_built_tree(small_f16: Path, tmp_path: Path):
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    (tree / lc.CONVERT_SCRIPT).write_text("# a tree that was never built\n")
    with pytest.raises(ToolError, match="llama-quantize not found") as e:
        quantize(small_f16, tmp_path / "o.gguf", "Q8_0", engine="binary", llama_cpp=tree)
    assert "get-llama-cpp.sh" in e.value.one_line()
    with pytest.raises(ToolError, match="llama.cpp folder not found"):
        quantize(small_f16, tmp_path / "o.gguf", "Q8_0", llama_cpp=tmp_path / "nowhere")


@pytest.mark.parametrize("engine", ["binary", "library"])
def test_failing_quantize_shows_last_lines_and_leaves_nothing(
    engine: str, tmp_path: Path, llama_tree: Path
):
    weird = write_small_gguf(tmp_path / "weird.gguf", arch="nosucharch")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ToolError) as e:
        quantize(weird, out_dir / "o.gguf", "Q8_0", engine=engine, llama_cpp=llama_tree)
    line = e.value.one_line()
    assert "nosucharch" in line and "failed" in line
    assert list(out_dir.iterdir()) == []


def test_existing_output_needs_force(small_f16: Path, llama_tree: Path, tmp_path: Path):
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(OutputError, match="exists"):
        quantize(small_f16, out, "Q8_0", llama_cpp=llama_tree)
    assert out.read_bytes() == b"keep me"
    quantize(small_f16, out, "Q8_0", llama_cpp=llama_tree, force=True)
    assert out.read_bytes()[:4] == b"GGUF" and leftovers(tmp_path) == []


class _Interrupt(RecordingProgress):
    def advance(self, key, amount=1, description=None):
        super().advance(key, amount, description)
        if amount:
            raise KeyboardInterrupt


@pytest.mark.parametrize("engine", ["binary", "library"])
def test_interrupt_removes_the_partial_output(
    engine: str, small_f16: Path, llama_tree: Path, tmp_path: Path
):
    with pytest.raises(KeyboardInterrupt):
        quantize(
            small_f16, tmp_path / "o.gguf", "Q8_0", engine=engine, llama_cpp=llama_tree,
            progress=_Interrupt(),
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_a_real_process(tiny_f16: Path, llama_tree: Path, tmp_path: Path, held_run):
    for engine in ("binary", "library"):
        out = tmp_path / f"{engine}.gguf"
        proc = held_run(
            [sys.executable, "-m", "moss_gguf_cli", "quantize", str(tiny_f16), str(out)]
            + ["Q4_K_M", "--engine", engine, "--llama-cpp", str(llama_tree)],
            "quantize",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # held after its first tensor: the partial output is there, the run unfinished
        assert list(tmp_path.glob(f".{out.name}.partial-*")) and proc.poll() is None
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "interrupted" in err
        assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- pure helpers


def test_output_names():
    assert output_name(Path("w/backbone_f16.gguf"), "Q4_K_M") == "backbone_q4_k_m.gguf"
    assert output_name(Path("backbone-BF16.gguf"), "Q8_0") == "backbone_q8_0.gguf"
    assert output_name(Path("model.gguf"), "IQ4_XS") == "model_iq4_xs.gguf"
    assert output_name(Path("f16.gguf"), "Q6_K") == "f16_q6_k.gguf"


def test_build_quantize_cmd():
    cmd = lc.build_quantize_cmd(
        "/x/llama-quantize", Path("in.gguf"), Path("out.gguf"), "Q4_K_M", threads=3,
        imatrix=Path("m.dat"), token_embedding_type="Q8_0", output_tensor_type="F16",
        allow_requantize=True, pure=True,
    )  # fmt: skip
    assert cmd == [
        "/x/llama-quantize", "--allow-requantize", "--pure", "--imatrix", "m.dat",
        "--token-embedding-type", "Q8_0", "--output-tensor-type", "F16",
        "in.gguf", "out.gguf", "Q4_K_M", "3",
    ]  # fmt: skip
    assert lc.build_quantize_cmd("q", "a", "b", "Q8_0") == ["q", "a", "b", "Q8_0"]


def test_pass_through_options(small_f16: Path, quantize_bin: Path, llama_tree: Path, tmp_path):
    ref = tmp_path / "ref.gguf"
    run_binary(
        quantize_bin, "--pure", "--token-embedding-type", "q8_0", "--output-tensor-type", "f16",
        small_f16, ref, "Q5_0", "2",
    )  # fmt: skip
    for engine in ("binary", "library"):
        r = quantize(
            small_f16, tmp_path / f"{engine}.gguf", "q5_0", engine=engine, llama_cpp=llama_tree,
            pure=True, token_embedding_type="Q8_0", output_tensor_type="F16", threads=2,
        )[0]  # fmt: skip
        assert filecmp.cmp(r.output, ref, shallow=False), engine
    types = gguf_tensor_types(ref)
    assert types["token_embd.weight"] == "Q8_0" and types["output.weight"] == "F16"


def test_plan_resolves_auto_and_names(small_f16: Path, llama_tree: Path, tmp_path: Path):
    _, jobs = plan_quantize(small_f16, types=["q8_0", "Q8_0", "q4_k"], output_dir=tmp_path)
    assert [j.file_type for j in jobs] == ["Q8_0", "Q4_K_M"]
    assert [j.output.name for j in jobs] == ["small_q8_0.gguf", "small_q4_k_m.gguf"]
    _, jobs = plan_quantize(
        small_f16, tmp_path / "x.gguf", "Q8_0", settings=lc_settings(llama_tree, "auto")
    )
    assert jobs[0].engine.value == "binary" and jobs[0].command[0].endswith("llama-quantize")


def lc_settings(tree: Path, engine: str):
    from moss_gguf_cli.quantize.llama import QuantizeSettings

    return QuantizeSettings.from_dict({"engine": engine, "llama_cpp": str(tree)})


# ----------------------------------------------------------------------------- CLI


def test_cli_guide_form(small_f16: Path, quantize_bin: Path, llama_tree: Path, tmp_path: Path):
    out = tmp_path / "backbone_q4km.gguf"
    res = runner.invoke(
        app, ["quantize", str(small_f16), str(out), "Q4_K_M", "--llama-cpp", str(llama_tree)]
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(out)
    ref = tmp_path / "ref.gguf"
    run_binary(quantize_bin, small_f16, ref, "Q4_K_M")
    assert filecmp.cmp(out, ref, shallow=False)
    assert "Q4_K_M" in res.stderr and "fallback" in res.stderr  # summary + fallback list


def test_cli_several_types(small_f16: Path, llama_tree: Path, tmp_path: Path):
    res = runner.invoke(
        app,
        ["quantize", str(small_f16), "--type", "q4_k_m", "-t", "Q8_0", "--output-dir"]
        + [str(tmp_path / "d"), "--engine", "library", "--quiet"],
    )
    assert res.exit_code == 0, res.output
    expected = [tmp_path / "d" / "small_q4_k_m.gguf", tmp_path / "d" / "small_q8_0.gguf"]
    assert res.stdout.split() == [str(p) for p in expected]
    assert all(p.is_file() for p in expected)


def test_cli_input_type_form_and_dry_run(small_f16: Path, llama_tree: Path, tmp_path: Path):
    src = tmp_path / "backbone_f16.gguf"
    shutil.copy(small_f16, src)
    res = runner.invoke(
        app, ["quantize", str(src), "q8_0", "--dry-run", "--llama-cpp", str(llama_tree)]
    )
    assert res.exit_code == 0, res.output
    line = res.stdout.strip()
    assert line.split()[0].endswith("llama-quantize")
    assert line.endswith(f"{src} {tmp_path / 'backbone_q8_0.gguf'} Q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backbone_f16.gguf"]
    res = runner.invoke(app, ["quantize", str(src), "q8_0", "--engine", "library", "--dry-run"])
    assert res.exit_code == 0 and "library engine" in res.stdout
    res = runner.invoke(app, ["quantize", str(src), "q8_0", "--threads", "1", "--quiet"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "backbone_q8_0.gguf").is_file()


def test_cli_errors(small_f16: Path, tmp_path: Path):
    res = runner.invoke(app, ["quantize", str(small_f16), str(tmp_path / "o.gguf"), "Q4_K_XL"])
    assert res.exit_code == 2 and "unknown quantization type" in res.stderr
    assert "Q4_K_M" in res.stderr and "Traceback" not in res.output
    res = runner.invoke(app, ["quantize", str(small_f16), str(small_f16), "Q8_0"])
    assert res.exit_code == 2 and "output path is the input" in res.stderr
    res = runner.invoke(app, ["quantize", str(small_f16)])
    assert res.exit_code == 2 and "no quantization type" in res.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_text("hello")
    res = runner.invoke(app, ["quantize", str(bad), str(tmp_path / "o.gguf"), "Q8_0"])
    assert res.exit_code == 2 and "not a GGUF" in res.stderr
    (tmp_path / "o.gguf").write_text("x")
    res = runner.invoke(app, ["quantize", str(small_f16), str(tmp_path / "o.gguf"), "Q8_0"])
    assert res.exit_code == 1 and "--force" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "o.gguf"]


def test_cli_help_has_examples():
    res = runner.invoke(app, ["quantize", "--help"], env={"COLUMNS": "120"})
    assert res.exit_code == 0
    for text in ("--output-dir", "--engine", "--imatrix", "backbone_q4_k_m.gguf", "Q4_K_M"):
        assert text in res.stdout
