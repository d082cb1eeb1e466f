"""Which x86-64 instruction sets to build llama.cpp with, and whether a build fits this CPU.

llama-cpp-python compiles llama.cpp when it is installed. Its default (``-march=native``)
turned on AMX on a VM whose CPU reported it, and that build crashed on the first quantized
matmul; a fixed portable list (AVX-512 forced on) dies with an illegal instruction on a CPU
without AVX-512. So the install script asks this module for the flags: every ggml option is
set explicitly from the CPU's ``/proc/cpuinfo`` flags, AMX always off.

Stdlib only, so ``scripts/install.sh`` can run it (``python -m moss_gguf_cli.native.cpu_features``)
before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .pins import LLAMA_CPP_PYTHON


def physical_cores(cpus: Iterable[int] | None = None) -> int:
    """The physical cores among CPUS, by default those this process may run on (a core's
    second hardware thread shares its arithmetic units: llama.cpp's own default counts cores,
    not threads); the logical CPUs where /sys does not say."""
    if cpus is None:
        try:
            cpus = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            return os.cpu_count() or 1
    cpus = sorted(cpus)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))  # fmt: skip
        except OSError:
            return len(cpus) or 1
    return len(cores) or 1


# ggml option → the /proc/cpuinfo flags it needs, in the order the CMake line lists them.
# GGML_AVX512 compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw.
GGML_ISA_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
)
# How to (re)install llama-cpp-python built for the CPU the command runs on.
REINSTALL_HINT = (
    'CMAKE_ARGS="$(python -m moss_gguf_cli.native.cpu_features)" pip install --force-reinstall '
    f"--no-cache-dir llama-cpp-python=={LLAMA_CPP_PYTHON} (scripts/install.sh does this)"
)
# Never turned on: the AMX build is the one that crashed (see the module docstring).
GGML_ALWAYS_OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# The AVX-512 extensions are compiled only inside the AVX-512 block of ggml's CMake.
_NEEDS_AVX512 = {"GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"}

# llama_print_system_info() names → /proc/cpuinfo flags, for checking an installed build.
SYSTEM_INFO_FEATURES: Mapping[str, tuple[str, ...]] = {
    "SSE3": ("pni",),
    "SSSE3": ("ssse3",),
    "AVX": ("avx",),
    "AVX_VNNI": ("avx_vnni",),
    "AVX2": ("avx2",),
    "F16C": ("f16c",),
    "FMA": ("fma",),
    "BMI2": ("bmi2",),
    "AVX512": ("avx512f",),
    "AVX512_VBMI": ("avx512vbmi",),
    "AVX512_VNNI": ("avx512_vnni",),
    "AVX512_BF16": ("avx512_bf16",),
    "AMX_INT8": ("amx_int8",),
}


@dataclass(frozen=True)
class BuildFlags:
    """The ggml options for one CPU; ``cmake_args`` is what ``CMAKE_ARGS`` gets."""

    options: tuple[tuple[str, bool], ...]

    @property
    def cmake_args(self) -> str:
        parts = ["-DGGML_NATIVE=OFF"]
        parts += [f"-D{name}={'ON' if on else 'OFF'}" for name, on in self.options]
        return " ".join(parts)

    @property
    def enabled(self) -> list[str]:
        return [name.removeprefix("GGML_") for name, on in self.options if on]

    @property
    def key(self) -> str:
        """A short, stable name for caches of builds made with these flags."""
        return hashlib.sha256(self.cmake_args.encode()).hexdigest()[:12]


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in a ``/proc/cpuinfo`` text (empty if none)."""
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    return frozenset(m.group(1).split()) if m else frozenset()


def read_cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        return cpu_flags(path.read_text(errors="replace"))
    except OSError:
        return frozenset()


def choose_build_flags(flags: Iterable[str]) -> BuildFlags:
    """ggml ISA options for a CPU with these ``/proc/cpuinfo`` flags: on only where present."""
    have = set(flags)
    chosen: list[tuple[str, bool]] = []
    for name, needs in GGML_ISA_OPTIONS:
        on = all(f in have for f in needs)
        if name in _NEEDS_AVX512:
            on = on and dict(chosen).get("GGML_AVX512", False)
        chosen.append((name, on))
    chosen += [(name, False) for name in GGML_ALWAYS_OFF]
    return BuildFlags(tuple(chosen))


@dataclass(frozen=True)
class BuildFit:
    """How an installed llama.cpp's compiled-in CPU features compare with this CPU."""

    used: tuple[str, ...]  # features the build was compiled with
    missing: tuple[str, ...]  # used by the build, absent on this CPU: illegal instruction
    unused: tuple[str, ...]  # on this CPU, left out of the build: slower than it could be
    amx: bool  # the build uses AMX (the configuration that crashed)

    @property
    def fits(self) -> bool:
        return not self.missing and not self.amx


def parse_system_info(text: str) -> dict[str, bool]:
    """``llama_print_system_info()`` → {feature: on}, for the CPU part of it."""
    out: dict[str, bool] = {}
    for name, value in re.findall(r"([A-Z][A-Z0-9_]*)\s*=\s*(\d+)", text):
        out[name] = value != "0"
    return out


def build_fit(system_info: str, flags: Iterable[str]) -> BuildFit:
    """Compare a build's ``llama_print_system_info()`` with a CPU's flags."""
    have = set(flags)
    info = parse_system_info(system_info)
    used = tuple(n for n in SYSTEM_INFO_FEATURES if info.get(n))
    missing = tuple(
        n for n in used if not all(f in have for f in SYSTEM_INFO_FEATURES[n])
    )
    # ggml lists only the features a build has: absent means compiled out
    unused = tuple(
        n
        for n, needs in SYSTEM_INFO_FEATURES.items()
        if not info.get(n) and n != "AMX_INT8" and all(f in have for f in needs)
    )
    amx = bool(info.get("AMX_INT8"))
    return BuildFit(used=used, missing=missing, unused=unused, amx=amx)


def is_x86_64(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def main(argv: list[str]) -> int:
    """``--cmake-args`` prints CMAKE_ARGS for this CPU; ``--key`` its cache key.

    Off x86-64 nothing is chosen (an empty line): llama.cpp's own defaults apply there.
    """
    flags = choose_build_flags(read_cpu_flags())
    x86 = is_x86_64()
    if argv[1:] == ["--key"]:
        print(flags.key if x86 else "default")
    elif argv[1:] in ([], ["--cmake-args"]):
        print(flags.cmake_args if x86 else "")
    elif argv[1:] == ["--enabled"]:
        print(" ".join(flags.enabled) if x86 else "llama.cpp defaults")
    else:
        print("usage: python -m moss_gguf_cli.native.cpu_features [--cmake-args|--key|--enabled]",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
