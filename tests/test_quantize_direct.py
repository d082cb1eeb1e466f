"""The direct engine: every byte as the guide's chain writes it, from one read of the source.

The reference is the two-step chain run for real: the f16 GGUF (our converter, whose parity
with convert_hf_to_gguf.py test_convert checks) and the pinned llama-quantize binary on it.
Checkpoints: builtin:tiny (rows of 256 and 768: every K-quant fits) and one of 320/832
columns (no K-quant fits: llama.cpp's fallbacks).
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest
from builds import Builds
from conftest import QUANT_TYPES
from gguf_reading import gguf_reader

from moss_gguf_cli.errors import UsageError
from moss_gguf_cli.pipeline.convert import convert
from moss_gguf_cli.quantize.direct import quantize_checkpoint
from moss_gguf_cli.quantize.llama import QuantizeSettings, inspect_gguf, load_imatrix

TYPES = QUANT_TYPES


def chain(model: Path, exe: Path, folder: Path, types: list[str], *extra: str) -> dict[str, Path]:
    """The guide's two steps: an f16 GGUF, then llama-quantize once per type."""
    f16 = folder / "chain_f16.gguf"
    if not f16.exists():
        convert(model, f16, outtype="f16")
    out = {}
    for t in types:
        out[t] = folder / f"chain_{t}.gguf"
        done = subprocess.run(
            [str(exe), *extra, str(f16), str(out[t]), t], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return out


def direct(model: Path, folder: Path, types: list[str], imatrix: Path | None = None, **kw):
    data = load_imatrix(imatrix) if imatrix else None
    outputs = [(folder / f"direct_{t}.gguf", t) for t in types]
    s = QuantizeSettings(imatrix=imatrix, threads=kw.pop("threads", None))
    return quantize_checkpoint(model, outputs, "auto", s, data, folder, **kw)


@pytest.mark.parametrize("which", ["tiny", "odd"])
def test_byte_identical_to_the_chain(which, tiny_model, odd_model, quantize_bin, tmp_path,
                                     tiny_f16_gguf, tiny_llama_quantized):  # fmt: skip
    model = tiny_model if which == "tiny" else odd_model
    if which == "tiny":  # the chain on builtin:tiny is the run's shared f16 and its types
        refs, f16 = tiny_llama_quantized, tiny_f16_gguf
    else:
        refs, f16 = chain(model, quantize_bin, tmp_path, TYPES), tmp_path / "chain_f16.gguf"
    got = direct(model, tmp_path, TYPES, keep_intermediate=True)
    assert [r.file_type for r in got.results] == TYPES
    for r in got.results:
        assert filecmp.cmp(r.output, refs[r.file_type], shallow=False), r.file_type
    # the kept intermediate is the chain's f16 GGUF itself
    assert got.intermediate == tmp_path / "backbone_f16.gguf"
    assert filecmp.cmp(got.intermediate, f16, shallow=False)
    types = {t.name: t.type for t in inspect_gguf(refs["Q4_K_M"]).tensors.values()}
    if which == "odd":  # llama.cpp's fallbacks were taken, and reported
        assert types["blk.0.attn_q.weight"] != "Q4_K"
        assert got.results[0].fallbacks
    else:
        assert types["blk.0.attn_q.weight"] == "Q4_K" and not got.results[0].fallbacks
        assert "Q6_K" in types.values()  # Q4_K_M's mix: some tensors get more bits


def write_imatrix(path: Path, f16: Path) -> tuple[Path, int]:
    """An importance matrix (llama-imatrix's GGUF format) for every 2-D weight."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "imatrix")
    n = 0
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["calibration.txt"])
    w.add_uint32("imatrix.chunk_count", 9)
    w.add_uint32("imatrix.chunk_size", 512)
    for t in inspect_gguf(f16).tensors.values():
        if len(t.shape) == 2 and t.name != "token_embd.weight":
            n += 1
            w.add_tensor(t.name + ".in_sum2", rng.uniform(1, 900, t.shape[0]).astype(np.float32))
            w.add_tensor(t.name + ".counts", np.array([30.0], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, n


def test_imatrix_types_byte_identical(tiny_model, tiny_f16_gguf, quantize_bin, tmp_path):
    f16 = Builds.copy(tiny_f16_gguf, tmp_path / "chain_f16.gguf")  # the chain's first step
    imatrix, entries = write_imatrix(tmp_path / "imatrix.gguf", f16)
    types = ["IQ4_XS", "Q4_K_M"]
    refs = chain(tiny_model, quantize_bin, tmp_path, types, "--imatrix", str(imatrix))
    got = direct(tiny_model, tmp_path, types, imatrix)
    for r in got.results:
        assert filecmp.cmp(r.output, refs[r.file_type], shallow=False), r.file_type
    plain = direct(tiny_model, tmp_path / "plain", ["Q4_K_M"])
    assert not filecmp.cmp(plain.results[0].output, refs["Q4_K_M"], shallow=False)
    fields = gguf_reader(got.results[0].output).fields
    assert fields["quantize.imatrix.entries_count"].contents() == entries


def test_a_type_that_needs_an_imatrix_is_refused_before_work(tiny_model, tmp_path):
    with pytest.raises(UsageError, match="IQ2_XS needs an importance matrix"):
        direct(tiny_model, tmp_path, ["IQ2_XS"])
    assert list(tmp_path.iterdir()) == []  # no stand-in left, nothing half-written


def test_thread_count_does_not_change_a_byte(tiny_model, tmp_path):
    one = direct(tiny_model, tmp_path / "one", ["Q4_K_M"], threads=1).results[0].output
    three = direct(tiny_model, tmp_path / "three", ["Q4_K_M"], threads=3).results[0].output
    assert filecmp.cmp(one, three, shallow=False)


def test_the_digest_taken_while_writing_is_the_files(tiny_model, tmp_path):
    """layout's manifest reuses it instead of hashing the GGUF again: it must be exact."""
    from moss_gguf_cli.disk.digests import HashRecord, sha256_file

    record = HashRecord()
    results = direct(tiny_model, tmp_path, ["Q4_K_M", "Q8_0"], record=record).results
    for r in results:
        digest = record.known_sha256(r.output)
        assert digest == record.known_checked_gguf(r.output) == sha256_file(r.output)


def test_verify_trusts_only_the_very_file_the_engine_checked(tiny_model, tmp_path):
    """The engine validated every block as it wrote it, so verify (in `all`'s process) need
    not read the GGUF again; once the file changes it is another file, read and judged."""
    import time

    from moss_gguf_cli.disk.digests import HashRecord
    from moss_gguf_cli.verify import read_gguf, verify

    record = HashRecord()  # `all`'s, handed from its quantize step to its verify step
    out = direct(tiny_model, tmp_path, ["Q4_K_M"], record=record).results[0].output
    before = _rchar()
    rows = {r.name: r for r in verify(out, record=record).rows}
    assert rows["GGUF values"].status == "pass", rows["GGUF values"]
    assert _rchar() - before < out.stat().st_size / 4
    time.sleep(0.05)  # past the filesystem clock's tick: the write below gets a new mtime
    g = read_gguf(out)
    t = g.tensors["blk.1.ffn_up.weight"]
    assert t.type_name == "Q4_K"
    with open(out, "r+b") as f:
        f.seek(g.abs_offset(t) + 7 * 144)  # the d scale of block 7
        f.write(np.float16(np.nan).tobytes())
    failing = {r.name: r.detail for r in verify(out, record=record).rows if r.status == "fail"}
    assert failing.get("GGUF values") == "blk.1.ffn_up.weight holds Inf/NaN", failing


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def test_three_types_read_the_source_once(tiny_model, tmp_path):
    from moss_gguf_cli.source.backbone import open_backbone

    source = sum(t.nbytes for t in open_backbone(tiny_model).tensors.values())

    def bytes_read(folder: Path, types: list[str]) -> int:
        before = _rchar()
        assert len(direct(tiny_model, folder, types).results) == len(types)
        return _rchar() - before

    one = bytes_read(tmp_path / "one", ["Q4_K_M"])
    three = bytes_read(tmp_path / "three", ["Q4_K_M", "Q6_K", "Q8_0"])
    assert one >= source
    # two more types add their headers' reads (llama.cpp's dry run), no second read
    assert three - one < source * 0.15, (one, three, source)
    assert sorted(p.name for p in (tmp_path / "three").iterdir()) == [
        "direct_Q4_K_M.gguf", "direct_Q6_K.gguf", "direct_Q8_0.gguf",
    ]  # fmt: skip


def test_a_type_two_outputs_share_is_quantized_once(tiny_model, tmp_path, monkeypatch):
    """Q4_K_M's Q6_K tensors are the Q6_K file's bytes: one run making both quantizes them
    once (the byte-identity test above checks the shared bytes are right in both files)."""
    from moss_gguf_cli.native import libggml

    counted: dict[int, int] = {}
    lock = threading.Lock()  # the pool's threads call it at once
    real = libggml.quantize_rows

    def counting(type_id, src, dst, row0, row1, imatrix):
        with lock:
            counted[type_id] = counted.get(type_id, 0) + (row1 - row0) * src.shape[1]
        return real(type_id, src, dst, row0, row1, imatrix)

    monkeypatch.setattr(libggml, "quantize_rows", counting)
    got = direct(tiny_model, tmp_path, ["Q4_K_M", "Q6_K"])
    q6k = int(gguf.GGMLQuantizationType.Q6_K)
    in_files = {
        r.file_type: sum(
            int(np.prod(t.shape)) for t in inspect_gguf(r.output).tensors.values()
            if t.type == "Q6_K"
        )
        for r in got.results
    }  # fmt: skip
    assert 0 < in_files["Q4_K_M"] < in_files["Q6_K"]  # the mix shares some, not all
    assert counted[q6k] == in_files["Q6_K"], (counted, in_files)


def test_all_direct_and_binary_engines_agree(tiny_model, tmp_path, llama_tree):
    def run(engine: str) -> Path:
        out = tmp_path / engine
        cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", "builtin:tiny"]
        cmd += ["--output", str(out), "--engine", engine, "--llama-cpp", str(llama_tree), "-q"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return out / "backbone_q4_k_m.gguf"

    assert filecmp.cmp(run("direct"), run("binary"), shallow=False)


def test_bf16_rounding_byte_identical(tiny_model, quantize_bin, tmp_path):
    """`--outtype bf16`: the values go through a bf16 intermediate, as llama-quantize reads it."""
    bf16 = tmp_path / "chain_bf16.gguf"
    convert(tiny_model, bf16, outtype="bf16")
    ref = tmp_path / "ref_Q8_0.gguf"
    done = subprocess.run([str(quantize_bin), str(bf16), str(ref), "Q8_0"], capture_output=True)
    assert done.returncode == 0
    outputs = [(tmp_path / "direct_Q8_0.gguf", "Q8_0")]
    got = quantize_checkpoint(tiny_model, outputs, "bf16", QuantizeSettings(), None, tmp_path)
    assert got.outtype == "bf16"
    assert filecmp.cmp(got.results[0].output, ref, shallow=False)


def test_every_bf16_value_widens_as_the_f16_intermediate_holds_it():
    """The workers' shortcut (a shift, f16 rounding only below 2**-14) against the chain's
    bf16 → f16 → f32, for every finite bf16 pattern within float16's range."""
    import ml_dtypes

    from moss_gguf_cli.quantize.direct import _QT, _widen_into

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7FFF) < 0x4780]  # the reader refuses the rest (inf in f16, NaN)
    chain = bits.view(ml_dtypes.bfloat16).astype(np.float16).astype(np.float32)
    got = np.empty(bits.shape, np.float32)
    _widen_into(bits, got, _QT.F16)
    assert np.array_equal(got.view(np.uint32), chain.view(np.uint32))
