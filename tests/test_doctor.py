"""`doctor` and pre-flight on this machine, with real components: the real llama.cpp runtime
probe (a child process), a really crashing child, real small filesystems (tmpfs), the CLI.

conftest points MOSS_GGUF_CACHE at a per-session folder, so the probe's cache lives there:
the first test that needs the probe pays for it, later ones read it. Tests about the cache
itself use a folder of their own.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moss_gguf_cli import doctor as dr
from moss_gguf_cli.cli.app import app
from moss_gguf_cli.errors import OutputError, ToolError

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
VERSION_ROWS = [
    "moss-gguf",
    "Python",
    "numpy",
    "gguf",
    "safetensors",
    "huggingface_hub",
    "llama-cpp-python",
    "onnxruntime",
    "tokenizers",
    "soundfile",
    "torch",
]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def crashing_child(sig: int, stage: str = "decoding the Q4_K_M model"):
    """A child that records a stage the way the probe does, then dies of sig."""

    def build(workdir: Path) -> list[str]:
        code = (
            "import os, sys; "
            f"open(os.path.join(sys.argv[1], 'stages'), 'a').write({stage!r} + '\\n'); "
            "sys.stderr.write('GGML_ASSERT(ne % 256 == 0) failed\\n'); sys.stderr.flush(); "
            f"os.kill(os.getpid(), {int(sig)})"
        )
        return [sys.executable, "-c", code, str(workdir)]

    return build


@pytest.fixture
def no_llama_quantize(monkeypatch: pytest.MonkeyPatch) -> None:
    """No llama-quantize anywhere: not in $LLAMA_CPP_DIR, not on PATH."""
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    keep = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if not (Path(d) / "llama-quantize").exists()
    ]
    monkeypatch.setenv("PATH", os.pathsep.join(keep))


def _tmpfs(folder: Path, size: str):
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path):
    yield from _tmpfs(tmp_path / "small", "50m")


@pytest.fixture
def roomy_disk(tmp_path: Path):
    """Room for the real model whatever this machine's disk holds (tmpfs only caps, and
    nothing is written to it)."""
    yield from _tmpfs(tmp_path / "roomy", "64g")


# ----------------------------------------------------------------------------- every check


def test_every_check_passes_here(roomy_disk: Path, no_llama_quantize: None) -> None:
    report = dr.doctor(output=roomy_disk)
    by_name = {r.name: r for r in report.rows}
    assert [r.name for r in report.rows if r.group == "versions"] == VERSION_ROWS
    for name in VERSION_ROWS:
        assert by_name[name].status == dr.PASS, by_name[name]
    assert importlib.metadata.version("numpy") in by_name["numpy"].detail
    # llama.cpp carried by llama-cpp-python, read from libllama itself
    import llama_cpp

    assert llama_cpp.__version__ in by_name["llama-cpp-python"].detail
    assert "commit " in by_name["llama-cpp-python"].detail
    assert "CPUExecutionProvider" in by_name["onnxruntime"].detail
    # engines: no binary here, so auto is the library
    assert by_name["llama-quantize"].status == dr.WARN
    assert "get-llama-cpp.sh" in by_name["llama-quantize"].fix
    assert by_name["libllama"].status == dr.PASS
    assert by_name["auto engine"].status == dr.PASS and "library" in by_name["auto engine"].detail
    # the runtime really ran both quantized models and agreed with f16
    runtime = by_name["llama.cpp runtime"]
    assert runtime.status == dr.PASS, runtime
    assert set(report.probe.cosine) == {"Q8_0", "Q4_K_M"}
    assert report.probe.cosine["Q8_0"] > 0.99 and report.probe.cosine["Q4_K_M"] > 0.9
    gpu = by_name["llama.cpp GPU"]
    nvidia = dr.nvidia_gpus()
    if not nvidia:  # no GPU: "CPU only" is a pass, not a failure
        assert gpu.status == dr.PASS and "CPU only" in gpu.detail
    else:  # a GPU the driver sees is named, used or not
        assert gpu.status in (dr.PASS, dr.WARN)
        assert "GPU offload:" in gpu.detail or nvidia[0] in gpu.detail
    assert by_name["onnxruntime GPU"].status in ((dr.PASS,) if not nvidia else (dr.PASS, dr.WARN))
    disk = by_name["output disk"]
    assert disk.status == dr.PASS and str(roomy_disk) in disk.detail
    assert "Q4_K_M" in by_name["output disk"].detail
    assert by_name["Hub cache"].status in (dr.PASS, dr.WARN)
    assert report.ok
    assert {r.group for r in report.rows} == set(dr.GROUPS)
    for r in report.rows:
        assert "\n" not in r.detail and "\n" not in r.fix
        assert r.status == dr.PASS or r.fix, r  # every warning and failure says what to do


def test_binary_engine_is_found_run_and_preferred(llama_tree: Path, roomy_disk: Path) -> None:
    report = dr.doctor(output=roomy_disk, llama_cpp=llama_tree)
    binary = report.row("llama-quantize")
    assert binary.status == dr.PASS, binary
    assert "llama-quantize" in binary.detail and "commit " in binary.detail
    assert "binary" in report.row("auto engine").detail
    assert report.ok


def test_bad_llama_cpp_dir_fails_with_the_quantize_message(tmp_path: Path) -> None:
    report = dr.doctor(output=tmp_path, llama_cpp=tmp_path / "nowhere")
    for name in ("llama-quantize", "auto engine"):
        row = report.row(name)
        assert row.status == dr.FAIL and "nowhere" in row.detail and row.fix
    assert not report.ok
    with pytest.raises(ToolError) as err:
        dr.preflight(
            needs_quantize=True,
            output=None,
            needed_bytes=None,
            llama_cpp=tmp_path / "nowhere",
            engine="auto",
        )
    assert "nowhere" in err.value.one_line()


# ----------------------------------------------------------------------------- the probe


def test_probe_cache_is_keyed_by_the_installed_build(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MOSS_GGUF_CACHE", str(tmp_path / "cache"))
    first = dr.runtime_probe()
    assert first.status == dr.PASS and not first.cached, first
    path = dr.probe_cache_path(first.key)
    assert path.is_file() and path.is_relative_to(tmp_path / "cache")
    recorded = json.loads(path.read_text())["key"]
    # the key is the build actually installed: version, libllama file, its size and mtime
    import llama_cpp

    lib = Path(llama_cpp.llama_cpp._lib._name).resolve()
    assert recorded["llama_cpp_python"] == llama_cpp.__version__
    assert recorded["libllama"] == str(lib)
    assert recorded["size"] == lib.stat().st_size
    assert recorded["mtime_ns"] == lib.stat().st_mtime_ns
    assert recorded == dr.probe_key()

    second = dr.runtime_probe()
    assert second.cached and second.status == dr.PASS and second.cosine == first.cosine
    report = dr.doctor(output=tmp_path)
    assert "cached" in report.row("llama.cpp runtime").detail
    # another build (here: another mtime) does not reuse it
    assert dr.read_cached_probe({**recorded, "mtime_ns": recorded["mtime_ns"] + 1}) is None


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGILL])
def test_a_crashing_child_is_explained_with_the_portable_build(sig: int) -> None:
    result = dr.run_probe(crashing_child(sig))
    assert result.status == dr.FAIL and result.crashed
    assert result.signal == signal.Signals(sig).name
    assert result.signal in result.detail
    assert "while decoding the Q4_K_M model" in result.detail
    assert result.fix.endswith(dr.PORTABLE_BUILD_FIX)
    assert "moss_gguf_cli.native.cpu_features" in result.fix and "--force-reinstall" in result.fix
    assert result.cacheable  # a property of the build: no point running it again


def test_an_abort_shows_llama_cpp_last_words() -> None:
    result = dr.run_probe(crashing_child(signal.SIGABRT, "quantizing to Q4_K_M (libllama)"))
    assert result.status == dr.FAIL and result.signal == "SIGABRT"
    assert "GGML_ASSERT" in result.detail and "quantizing to Q4_K_M" in result.detail


def test_a_cached_crash_stops_all_before_anything_is_written(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    env = {"MOSS_GGUF_CACHE": str(cache)}
    monkeypatch.setenv("MOSS_GGUF_CACHE", str(cache))
    # a crash recorded for the installed build, as a crashing probe records it
    crashed = dr.runtime_probe(build_cmd=crashing_child(signal.SIGSEGV))
    assert crashed.status == dr.FAIL and dr.probe_cache_path(crashed.key).is_file()

    work = tmp_path / "run"
    work.mkdir()
    proc = cli("all", "--model", "builtin:tiny", "--output", str(work / "w"), env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "SIGSEGV" in lines[0]
    assert "moss_gguf_cli.native.cpu_features" in lines[0] and "doctor --recheck" in lines[0]
    assert list(work.iterdir()) == []
    assert not (cache / "builtin").exists()  # stopped before even building the model

    doc = cli("doctor", "--json", env=env)
    assert doc.returncode == 1
    rows = {r["name"]: r for r in json.loads(doc.stdout)["rows"]}
    assert rows["llama.cpp runtime"]["status"] == "fail"
    assert dr.PORTABLE_BUILD_FIX in rows["llama.cpp runtime"]["fix"]

    # --recheck, as the hint says: the probe runs for real again, and its pass replaces the
    # recorded crash
    again = cli("doctor", "--recheck", "--json", env=env)
    row = {r["name"]: r for r in json.loads(again.stdout)["rows"]}["llama.cpp runtime"]
    assert row["status"] == "pass" and "cached" not in row["detail"], row
    assert dr.read_cached_probe(crashed.key).status == dr.PASS


# ----------------------------------------------------------------------------- disk


def test_disk_plan_is_all_s_own_plan(tiny_model: Path) -> None:
    from moss_gguf_cli.pipeline.run import AllSettings, plan_bytes

    tiny = {
        "hidden": 256,
        "intermediate": 768,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 64,
        "vocab": 151936,
        "n_vq": 32,
        "audio_rows": 1025,
    }
    for file_types in (("Q4_K_M",), ("Q8_0", "Q6_K")):
        settings = AllSettings(model="builtin:tiny", output=Path("w"), file_types=list(file_types))
        for direct in (False, True):
            expected = plan_bytes(tiny_model, settings, direct)
            assert abs(dr.model_plan(tiny, file_types, direct).output - expected) <= len(file_types)
    # the real model, against docs/ARCHITECTURE.md §1's sizes
    real = dr.real_model_plan(direct=False)
    assert 8.0e9 < real.backbone_params < 8.5e9
    assert 15e9 < real.intermediate < 17e9  # "f16 GGUF ≈ 16 GB"
    assert 4.5e9 < real.quantized["Q4_K_M"] < 5.2e9  # "Q4_K_M ≈ 4.8 GB"
    assert 15e9 < real.source < 18e9  # bf16 checkpoint
    assert real.output == real.tables + real.intermediate + real.quantized["Q4_K_M"] + (64 << 20)
    # the direct engine (what `all` picks where llama-cpp-python's libggml loads, as here)
    # writes no f16 GGUF: doctor plans without it
    direct = dr.real_model_plan()
    assert direct.intermediate == 0 and direct.output == real.output - real.intermediate
    assert "no f16 GGUF (the direct engine)" in direct.describe()


def test_preflight_stops_all_on_a_small_disk(small_disk: Path) -> None:
    proc = cli("all", "--model", "builtin:tiny", "--output", str(small_disk / "w"))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "this run needs" in lines[0] and "of free disk" in lines[0]
    assert str(small_disk) in lines[0] and "--output on a larger disk" in lines[0]
    assert list(small_disk.iterdir()) == []


def test_preflight_stops_quantize_on_a_small_disk(small_disk: Path, tmp_path: Path) -> None:
    src = dr.write_probe_gguf(tmp_path / "m_f16.gguf")
    # fill the disk so the output cannot fit
    (small_disk / "filler").write_bytes(b"\0" * (48 << 20))
    proc = cli("quantize", str(src), str(small_disk / "m_q8_0.gguf"), "Q8_0")
    assert proc.returncode == 1
    assert "of free disk" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    # and the same call on a roomy disk goes through
    ok = cli("quantize", str(src), str(tmp_path / "m_q8_0.gguf"), "Q8_0", "-q")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "m_q8_0.gguf").is_file()


def test_preflight_disk_message_is_the_doctor_s(small_disk: Path) -> None:
    with pytest.raises(OutputError) as err:
        dr.preflight(
            needs_quantize=False,
            output=small_disk / "w",
            needed_bytes=100 << 20,
            llama_cpp=None,
            engine="auto",
        )
    row = dr.disk_check(small_disk, 100 << 20, "this run")
    assert err.value.message == row.detail and err.value.hint == row.fix
    assert list(small_disk.iterdir()) == []


def test_doctor_output_on_a_small_disk_fails(small_disk: Path) -> None:
    result = runner.invoke(app, ["doctor", "--output", str(small_disk / "w"), "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    disk = next(r for r in data["rows"] if r["name"] == "output disk")
    assert disk["status"] == "fail" and str(small_disk) in disk["detail"]
    assert "GB" in disk["detail"] and disk["fix"]
    assert data["ok"] is False and data["counts"]["fail"] >= 1


# ----------------------------------------------------------------------------- CLI


def test_json_is_the_only_stdout_and_never_shows_the_token(
    tmp_path: Path, roomy_disk: Path
) -> None:
    secret = "hf_doctorTestTokenDoNotPrint1234"
    env = {
        "HF_TOKEN": secret,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),  # an empty Hub cache
    }
    proc = cli("doctor", "--json", "--output", str(roomy_disk), env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # the whole of stdout is one JSON document
    assert secret not in proc.stdout and secret not in proc.stderr
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["Hub token"]["status"] == "pass" and "configured" in rows["Hub token"]["detail"]
    offline = rows["Hub offline mode"]
    assert offline["status"] == "warn" and "HF_HUB_OFFLINE" in offline["detail"]
    assert str(tmp_path / "hf") in rows["Hub cache"]["detail"]
    assert data["ok"] is True and data["runtime_probe"]["status"] == "pass"
    assert set(data["counts"]) == {"pass", "warn", "fail"}


def test_table_and_exit_code(roomy_disk: Path) -> None:
    result = runner.invoke(app, ["doctor", "-o", str(roomy_disk)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("llama.cpp runtime", "auto engine", "output disk", "Hub token", "torch"):
        assert name in result.stdout
    assert "ready" in result.stdout


def test_help_has_examples() -> None:
    result = runner.invoke(app, ["doctor", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "moss-gguf doctor --json" in result.stdout and "--output" in result.stdout
