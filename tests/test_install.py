"""The install: one pinned llama.cpp, CPU flags from /proc/cpuinfo, doctor's fit row; a
missing package named by its extra; the installs check (scripts/check-installs.sh) covering
every extra a user installs, and failing when torch is imported on a user path again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moss_gguf_cli import doctor as dr
from moss_gguf_cli.native import cpu_features as cf
from moss_gguf_cli.native import pins
from moss_gguf_cli.report import FAIL, PASS, WARN

REPO = Path(__file__).resolve().parents[1]

BASE = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr"
HASWELL = f"{BASE} sse sse2 ssse3 pni sse4_1 sse4_2 popcnt avx f16c fma avx2 bmi1 bmi2"
ZEN4 = (
    f"{HASWELL} avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 "
    "avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq"
)
SAPPHIRE = f"{ZEN4} avx_vnni amx_bf16 amx_tile amx_int8"
SANDY = f"{BASE} sse sse2 ssse3 pni sse4_1 sse4_2 popcnt avx"


def cpuinfo(flags: str) -> str:
    return (
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\n"
        f"flags\t\t: {flags}\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    )


def options(flags: str) -> dict[str, bool]:
    return dict(cf.choose_build_flags(cf.cpu_flags(cpuinfo(flags))).options)


def test_avx2_only_cpu_gets_no_avx512():
    o = options(HASWELL)
    assert o["GGML_AVX2"] and o["GGML_FMA"] and o["GGML_F16C"] and o["GGML_BMI2"]
    assert not o["GGML_AVX512"] and not o["GGML_AVX512_VNNI"] and not o["GGML_AVX_VNNI"]


def test_avx512_cpu_gets_avx512_and_its_extensions():
    o = options(ZEN4)
    assert o["GGML_AVX512"] and o["GGML_AVX512_VBMI"]
    assert o["GGML_AVX512_VNNI"] and o["GGML_AVX512_BF16"]


def test_amx_is_never_enabled():
    o = options(SAPPHIRE)
    assert o["GGML_AVX512"] and o["GGML_AVX_VNNI"]
    assert not (o["GGML_AMX_TILE"] or o["GGML_AMX_INT8"] or o["GGML_AMX_BF16"])


def test_avx_without_avx2_and_partial_avx512():
    o = options(SANDY)
    assert o["GGML_AVX"] and o["GGML_SSE42"]
    assert not (o["GGML_AVX2"] or o["GGML_FMA"] or o["GGML_F16C"] or o["GGML_BMI2"])
    # avx512f alone is not the set GGML_AVX512 compiles for (-mavx512bw/dq/vl too)
    o = options(f"{HASWELL} avx512f avx512_vnni")
    assert not o["GGML_AVX512"] and not o["GGML_AVX512_VNNI"]


def test_every_option_is_explicit_and_native_is_off():
    flags = cf.choose_build_flags(cf.cpu_flags(cpuinfo(HASWELL)))
    args = flags.cmake_args.split()
    assert args[0] == "-DGGML_NATIVE=OFF"
    names = [a.split("=")[0].removeprefix("-D") for a in args[1:]]
    assert names == [n for n, _ in cf.GGML_ISA_OPTIONS] + list(cf.GGML_ALWAYS_OFF)
    assert "-DGGML_AVX512=OFF" in args and "-DGGML_AVX2=ON" in args


def test_key_follows_the_flags():
    a = cf.choose_build_flags(cf.cpu_flags(cpuinfo(HASWELL)))
    b = cf.choose_build_flags(cf.cpu_flags(cpuinfo(ZEN4)))
    assert a.key != b.key and len(a.key) == 12
    assert a.key == cf.choose_build_flags(cf.cpu_flags(cpuinfo(HASWELL))).key


def test_cpuinfo_without_flags():
    assert cf.cpu_flags("processor : 0\n") == frozenset()
    o = dict(cf.choose_build_flags(frozenset()).options)
    assert not any(o.values())


def test_module_prints_this_machines_cmake_args():
    done = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli.native.cpu_features"], capture_output=True, text=True,
        cwd=REPO, check=True,
    )  # fmt: skip
    expected = cf.choose_build_flags(cf.read_cpu_flags())
    if cf.is_x86_64():
        assert done.stdout.strip() == expected.cmake_args
    else:
        assert done.stdout.strip() == ""
    bad = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli.native.cpu_features", "--nope"], capture_output=True,
        text=True, cwd=REPO,
    )  # fmt: skip
    assert bad.returncode == 2 and "usage" in bad.stderr


# ----------------------------------------------------------------------------- doctor's row

AVX512_BUILD = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | "
    "OPENMP = 1 | REPACK = 1 | "
)
AVX2_BUILD = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)


@pytest.mark.parametrize(
    "system_info, flags, status, words",
    [
        (AVX512_BUILD, ZEN4, PASS, "matches this CPU"),
        (AVX512_BUILD, HASWELL, FAIL, "lacks AVX512"),
        (AVX2_BUILD, ZEN4, WARN, "also has AVX512"),
        (AVX2_BUILD, HASWELL, PASS, "matches this CPU"),
        (AVX512_BUILD + "AMX_INT8 = 1 | ", SAPPHIRE, WARN, "AMX is compiled in"),
    ],
)
def test_doctor_cpu_fit_row(system_info, flags, status, words):
    row = dr.cpu_fit_row("Test CPU", system_info, flags.split())
    assert row.status == status, row
    assert words in row.detail
    assert "llama.cpp uses SSE3" in row.detail
    if status != PASS:
        assert "moss_gguf_cli.native.cpu_features" in row.fix


def test_installed_build_matches_this_cpu():
    """scripts/install.sh built the installed llama-cpp-python for this very CPU."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    fit = cf.build_fit(info, cf.read_cpu_flags())
    assert fit.fits and not fit.unused, (info, fit)
    report_row = dr.cpu_fit_row("this CPU", info, sorted(cf.read_cpu_flags()))
    assert report_row.status == PASS, report_row


# ----------------------------------------------------------------------------- the one pin


def test_pyproject_requires_exactly_the_pin():
    import re

    text = (REPO / "pyproject.toml").read_text()
    reqs = re.findall(r'"llama-cpp-python([^"]*)"', text)
    assert reqs == [f"=={pins.LLAMA_CPP_PYTHON}"]


def test_installed_llama_cpp_python_is_the_pin():
    import llama_cpp

    assert llama_cpp.__version__ == pins.LLAMA_CPP_PYTHON


def test_scripts_take_the_version_from_the_pin():
    for script in ("install.sh", "get-llama-cpp.sh"):
        text = (REPO / "scripts" / script).read_text()
        assert "moss_gguf_cli.native.pins llama-cpp-python" in text, script
        assert "0.3." not in text, script  # no second copy of the version
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    for command in ("bash scripts/install.sh && moss-gguf all --model builtin:tiny",
                    "bash scripts/install.sh --test && ruff check . && python -m pytest -q"):
        assert command in ci and command in readme, command
    done = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli.native.pins", "llama-cpp-python"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == pins.LLAMA_CPP_PYTHON


def test_threads_default_to_the_physical_cores():
    """n_threads 0 (the default `all` writes) means the physical cores: 4 threads on a
    2-core machine measured slower (docs/memory-floor.md), and a second hardware thread
    shares its core's arithmetic."""
    import os

    from moss_gguf_cli.tts.defaults import SYNTH_DEFAULTS

    cores = cf.physical_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    siblings = {
        Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text().strip()
        for c in os.sched_getaffinity(0)
    }
    assert cores == len(siblings)  # one per core, whatever its hardware threads
    assert SYNTH_DEFAULTS["n_threads"] == 0


# ----------------------------------------------------------------------------- a missing package


@pytest.mark.parametrize(
    "module, words",
    [("torch", "needs the torch extra (torch is not installed) (pip install 'moss-gguf[torch]')"),
     ("av", "needs the serve extra (av is not installed) (pip install 'moss-gguf[serve]')"),
     ("uvicorn.config", "needs the serve extra (uvicorn is not installed)"),
     ("numpy", "numpy is not installed, and moss-gguf needs it (install moss-gguf again")],
)  # fmt: skip
def test_a_missing_package_names_its_extra(module: str, words: str) -> None:
    from moss_gguf_cli.errors import missing_package

    found = missing_package(ModuleNotFoundError(f"No module named {module!r}", name=module))
    assert found is not None and words in found.one_line()
    # a broken import inside the package is a bug to report, not an install to fix
    assert missing_package(ModuleNotFoundError("x", name="moss_gguf_cli.nope")) is None
    assert missing_package(ImportError("cannot import name 'x'", name="numpy")) is None


def test_the_catch_point_renders_a_missing_extra_as_one_line(tmp_path: Path) -> None:
    """uvicorn missing (the process's import of it fails as when it is not installed): serve
    says which extra in one line, not "unexpected" (the config is never read: the import is
    first)."""
    code = ("import sys; sys.modules['uvicorn'] = None\n"
            "from moss_gguf_cli.cli.app import main\n"
            f"sys.argv = ['moss-gguf', 'serve', '--config', {str(tmp_path / 'm.yaml')!r}]\n"
            "main()\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    line = done.stderr.strip()
    assert done.returncode == 1 and len(line.splitlines()) == 1, line
    assert "serve extra (uvicorn is not installed)" in line and "unexpected" not in line


# ----------------------------------------------------------------------------- the installs check

# Not in the environment the check test builds: torch's own top-level names, and this package
# (the copy under test takes its place)
WITHOUT = ("torch", "torchgen", "functorch", "moss_gguf", "__editable__")


def extras_in_pyproject() -> set[str]:
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([a-z][a-z0-9-]*) = \[", section, re.M))


def test_every_extra_is_documented_and_the_check_installs_each_users_one() -> None:
    """docs/install.md's table lists pyproject.toml's extras; every install line and hint names
    one of them; the installs check makes an environment for each a user installs (torch and
    test: the suite's own environment, command 2), and .ci/run runs it after the README's two
    commands."""
    extras = extras_in_pyproject()
    assert {"serve", "torch", "test", "gguf-tokenizer"} <= extras
    install = (REPO / "docs" / "install.md").read_text()
    table = install.split("## Extras", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (none|`[a-z-]+`) \|", table, re.M)
    assert {r.strip("`") for r in rows} == extras | {"none"}
    named = set()
    for page in [REPO / "README.md", REPO / "README_zh.md", *(REPO / "docs").rglob("*.md")]:
        text = page.read_text(encoding="utf-8")
        named |= set(re.findall(r"pip install '(?:\.|moss-gguf)\[([a-z-]+)\]'", text))
    code = "\n".join(p.read_text() for p in (REPO / "moss_gguf_cli").rglob("*.py"))
    named |= set(re.findall(r'extra_hint\("([a-z-]+)"\)', code))
    from moss_gguf_cli.errors import EXTRA_MODULES

    named |= set(EXTRA_MODULES)
    assert {"serve", "torch", "gguf-tokenizer"} <= named and named <= extras, named - extras
    script = (REPO / "scripts" / "check-installs.sh").read_text()
    checked = set(re.search(r"^EXTRAS_ALL=\(([^)]*)\)", script, re.M).group(1).split())
    assert checked == (extras | {"none"}) - {"torch", "test"}
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    tests_at = next(i for i, line in enumerate(ci) if line.endswith("python -m pytest -q"))
    assert ci[tests_at + 1:].count("bash scripts/check-installs.sh") == 1


def torchless_environment(root: Path, package: Path) -> Path:
    """A virtual environment holding what this one holds but torch, with PACKAGE's copy of
    moss_gguf_cli and its `moss-gguf` console script: the packages are links to this one's
    (nothing is downloaded), read through a .pth file of the new environment."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    deps = root / "deps"
    deps.mkdir(parents=True)
    for entry in site.iterdir():
        if not entry.name.startswith(WITHOUT) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    own_site = next((env / "lib").glob("python3*/site-packages"))
    (own_site / "deps.pth").write_text(f"{deps}\n{package}\n")
    script = env / "bin" / "moss-gguf"  # what pip writes for [project.scripts]
    script.write_text(f"#!{env / 'bin' / 'python'}\nimport sys\n"
                      "from moss_gguf_cli.cli.app import main\nsys.exit(main())\n")  # fmt: skip
    script.chmod(0o755)
    return env


def test_the_installs_check_fails_when_torch_is_imported_on_a_user_path(tmp_path: Path) -> None:
    """The check's steps (the first two: no torch, every --help) in an environment without
    torch pass on a copy of the package as it is, and fail, naming torch, once the copy's
    tokenizer module (on `all`'s path for a bare first-class file, imported by every command)
    imports torch again, as it did through transformers before."""
    import shutil

    copy = tmp_path / "copy"
    for part in ("moss_gguf_cli", "scripts"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = torchless_environment(tmp_path / "torchless", copy)
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run_env["PATH"] = f"{env / 'bin'}:{os.environ['PATH']}"

    def check() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(copy / "scripts" / "check-installs.sh"), "--here", "gguf-tokenizer",
             "--only", "torch,help"],
            capture_output=True, text=True, env=run_env, timeout=300,
        )  # fmt: skip

    done = check()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok  gguf-tokenizer: import torch fails" in done.stdout
    assert "ok  gguf-tokenizer: every command's --help" in done.stdout
    module = copy / "moss_gguf_cli" / "gguf" / "tokenizer_files.py"
    text = module.read_text()
    assert "\nimport gguf\n" in text
    module.write_text(text.replace("\nimport gguf\n", "\nimport gguf\nimport torch  # noqa\n", 1))
    done = check()
    assert done.returncode != 0
    assert "ok  gguf-tokenizer: import torch fails" in done.stdout
    assert "every command's --help" not in done.stdout
    assert "FAILED (gguf-tokenizer)" in done.stderr
    assert "No module named 'torch'" in done.stderr
