"""What is installed here: Python and the packages, libllama, the CPU, GPUs, the Hub settings."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from ..disk.staging import human_bytes
from ..errors import MossGgufError, extra_hint
from ..native import libllama
from ..native.cpu_features import REINSTALL_HINT, build_fit
from ..report import FAIL, PASS, WARN, CheckRow

REAL_MODEL_REPO = "OpenMOSS-Team/MOSS-TTS"


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version: '2.13.0+cpu' -> (2, 13, 0); () if it is none."""
    try:
        return Version(version).release
    except InvalidVersion:
        return ()


def _requirements() -> dict[str, tuple[str, str]]:
    """moss-gguf's own requirements: dist name -> (operator, version), e.g. ('>=', '1.24')."""
    try:
        reqs = metadata.requires("moss-gguf") or []
    except metadata.PackageNotFoundError:
        return {}
    out = {}
    for req in reqs:
        if "extra ==" in req:
            continue
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*(>=|==)\s*([\w.]+)", req)
        if m:
            out[_norm(m.group(1))] = (m.group(2), m.group(3))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# (shown name, distribution, module, required, what it is for)
PACKAGES = (
    ("numpy", "numpy", "numpy", True, "tables and heads"),
    ("gguf", "gguf", "gguf", True, "GGUF writing and reading"),
    ("safetensors", "safetensors", "safetensors", True, "checkpoint reading"),
    ("huggingface_hub", "huggingface_hub", "huggingface_hub", True, "Hub downloads"),
    ("tokenizers", "tokenizers", "tokenizers", True, "synth prompts"),
    ("soundfile", "soundfile", "soundfile", True, "WAV output"),
)


def package_row(name: str, dist: str, module: str, required: bool, why: str) -> CheckRow:
    version = dist_version(dist)
    req = _requirements().get(_norm(dist))
    spec = f"{dist}{req[0]}{req[1]}" if req else dist
    fix = f"pip install '{spec}'"
    if version is None:
        status = FAIL if required else WARN
        return CheckRow("versions", name, status, f"not installed (needed for {why})", fix)
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        return CheckRow(
            "versions",
            name,
            FAIL if required else WARN,
            f"{version} is installed but does not import: {one_line(exc)}",
            f"pip install --force-reinstall '{spec}'",
        )
    if req and not _satisfies(version, req):
        return CheckRow(
            "versions", name, FAIL, f"{version}, moss-gguf needs {req[0]}{req[1]}", fix
        )
    return CheckRow("versions", name, PASS, version)


def _satisfies(version: str, req: tuple[str, str]) -> bool:
    have, want = _release(version), _release(req[1])
    return have >= want if req[0] == ">=" else have[: len(want)] == want


def one_line(exc: BaseException) -> str:
    if isinstance(exc, MossGgufError):
        return exc.one_line()
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


def error_row(group: str, name: str, exc: MossGgufError) -> CheckRow:
    where = f"{exc.path}: " if exc.path else ""
    return CheckRow(group, name, FAIL, f"{where}{exc.message}", exc.hint or "")


def python_row() -> CheckRow:
    version = platform.python_version()
    try:
        wanted = metadata.metadata("moss-gguf").get("Requires-Python") or ""
    except metadata.PackageNotFoundError:
        wanted = ""
    m = re.match(r"\s*>=\s*([\d.]+)", wanted)
    if m and _release(version) < _release(m.group(1)):
        return CheckRow(
            "versions",
            "Python",
            FAIL,
            f"{version}, moss-gguf needs {wanted}",
            f"use Python {wanted} (e.g. a new virtual environment)",
        )
    return CheckRow("versions", "Python", PASS, f"{version} ({sys.executable})")


def onnxruntime_row() -> tuple[CheckRow, list[str] | None]:
    row = package_row("onnxruntime", "onnxruntime", "onnxruntime", True, "the audio codec")
    if row.status != PASS:
        return row, None
    import onnxruntime

    providers = list(onnxruntime.get_available_providers())
    row.detail += f"; providers: {', '.join(providers)}"
    return row, providers


def torch_row() -> CheckRow:
    # not imported: it takes seconds and only `verify --deep` needs it
    version = dist_version("torch")
    if version is None or importlib.util.find_spec("torch") is None:
        return CheckRow(
            "versions",
            "torch",
            WARN,
            "not installed (optional: only `verify --deep` needs it)",
            extra_hint("torch"),
        )
    return CheckRow("versions", "torch", PASS, f"{version} (optional, for `verify --deep`)")


def cpu_info() -> dict[str, Any]:
    """Model name and flags of the first CPU (Linux), else what platform knows."""
    info: dict[str, Any] = {"model": platform.processor() or platform.machine(), "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return info
    model = flags = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and flags is None:
            flags = value.split()
        if model is not None and flags is not None:
            break
    info["model"] = model or info["model"]
    info["flags"] = flags or []
    return info


def cpu_id(cpu: dict[str, Any]) -> str:
    """Which CPU a probe result belongs to (a shared home folder may serve several machines)."""
    text = "|".join([platform.machine(), cpu["model"], " ".join(sorted(cpu["flags"]))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cpu_fit_row(detail: str, system_info: str, flags: list[str]) -> CheckRow:
    """Whether the instruction sets llama.cpp was compiled with match this CPU's flags."""
    fit = build_fit(system_info, flags)
    detail += f"; llama.cpp uses {' '.join(fit.used) or 'no SIMD extensions'}"
    if fit.missing:
        missing = " ".join(fit.missing)
        return CheckRow(
            "runtime", "CPU", FAIL,
            f"{detail}; this CPU lacks {missing}: illegal instruction on first use",
            f"rebuild for this CPU: {REINSTALL_HINT}",
        )  # fmt: skip
    if fit.amx:
        return CheckRow(
            "runtime", "CPU", WARN,
            f"{detail}; AMX is compiled in (that build crashed on quantized matmuls)",
            f"rebuild without AMX: {REINSTALL_HINT}",
        )  # fmt: skip
    if fit.unused:
        return CheckRow(
            "runtime", "CPU", WARN,
            f"{detail}; matches this CPU, which also has {' '.join(fit.unused)} (slower)",
            f"rebuild for this CPU: {REINSTALL_HINT}",
        )  # fmt: skip
    return CheckRow("runtime", "CPU", PASS, f"{detail}; matches this CPU")


def _ggml_devices() -> list[dict[str, Any]]:
    """ggml's backend devices (name, description, type, memory) through libllama's handle."""
    import ctypes

    lib = libllama.handle()
    if lib is None:
        return []
    try:
        count = lib.ggml_backend_dev_count
        get = lib.ggml_backend_dev_get
        name = lib.ggml_backend_dev_name
        desc = lib.ggml_backend_dev_description
        dtype = lib.ggml_backend_dev_type
        memory = lib.ggml_backend_dev_memory
    except AttributeError:
        return []
    count.restype, count.argtypes = ctypes.c_size_t, []
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    for fn in (name, desc):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    dtype.restype, dtype.argtypes = ctypes.c_int, [ctypes.c_void_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    memory.restype, memory.argtypes = None, [ctypes.c_void_p, size_p, size_p]
    # the order of ggml's enum ggml_backend_dev_type
    kinds = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator", 4: "meta"}
    devices = []
    for i in range(count()):
        dev = get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append(
            {
                "name": (name(dev) or b"").decode("utf-8", "replace"),
                "description": (desc(dev) or b"").decode("utf-8", "replace"),
                "type": kinds.get(dtype(dev), str(dtype(dev))),
                "total": total.value,
            }
        )
    return devices


def nvidia_gpus() -> list[str]:
    """NVIDIA GPUs the driver reports (Linux), without needing any CUDA library."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return names


# what a synth or serve run does with the backbone's layers (n_gpu_layers, -1 by default)
ONLOAD = "yes, the n_gpu_layers of the config (-1, the default: all of them)"
NO_OFFLOAD = "no, every layer runs on the CPU"


def gpu_rows(safe_import: bool, providers: list[str] | None) -> list[CheckRow]:
    nvidia = nvidia_gpus()
    seen = f"; the driver reports {', '.join(nvidia)}" if nvidia else ""
    rows = []
    if not safe_import or dist_version("llama_cpp_python") is None:
        rows.append(
            CheckRow("gpu", "llama.cpp GPU", WARN, "not checked: llama-cpp-python unusable")
        )
    else:
        llama_cpp = libllama.bindings()
        llama_cpp.llama_backend_init()
        offload = bool(llama_cpp.llama_supports_gpu_offload())
        devices = _ggml_devices()
        gpus = [d for d in devices if d["type"] in ("GPU", "iGPU")]
        listed = "; ".join(
            f"{d['name']} {d['description']} ({human_bytes(d['total'])})" for d in gpus
        )
        if gpus:
            rows.append(CheckRow("gpu", "llama.cpp GPU", PASS, f"GPU offload: {listed}; "
                                 f"layers offloaded: {ONLOAD}"))  # fmt: skip
        elif offload:
            rows.append(
                CheckRow(
                    "gpu",
                    "llama.cpp GPU",
                    WARN,
                    f"built with GPU offload but no GPU device is visible{seen}; "
                    f"layers offloaded: {NO_OFFLOAD}",
                    "check the GPU driver and CUDA_VISIBLE_DEVICES (or set n_gpu_layers: 0)",
                )
            )
        elif nvidia:
            rows.append(
                CheckRow(
                    "gpu",
                    "llama.cpp GPU",
                    WARN,
                    f"CPU only: this llama-cpp-python has no GPU backend{seen}; "
                    f"layers offloaded: {NO_OFFLOAD}",
                    "for GPU speed: bash scripts/install.sh --gpu cuda (docs/memory-floor.md)",
                )
            )
        else:
            rows.append(CheckRow("gpu", "llama.cpp GPU", PASS, "CPU only (no GPU backend); "
                                 f"layers offloaded: {NO_OFFLOAD}"))  # fmt: skip
    if providers is None:
        rows.append(CheckRow("gpu", "onnxruntime GPU", WARN, "not checked: onnxruntime unusable"))
    elif "CUDAExecutionProvider" in providers:
        rows.append(CheckRow("gpu", "onnxruntime GPU", PASS, "CUDA (CUDAExecutionProvider)"))
    elif nvidia:
        rows.append(
            CheckRow(
                "gpu",
                "onnxruntime GPU",
                WARN,
                f"CPU only: no CUDAExecutionProvider{seen}",
                "for use_gpu_audio: pip uninstall onnxruntime && pip install onnxruntime-gpu",
            )
        )
    else:
        rows.append(CheckRow("gpu", "onnxruntime GPU", PASS, "CPU only (no CUDA provider)"))
    return rows


def model_cached(hub_cache: Path, repo_id: str) -> bool:
    snapshots = hub_cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return any(snapshots.glob("*/config.json"))


def hub_rows() -> list[CheckRow]:
    from huggingface_hub import constants, get_token

    repo = REAL_MODEL_REPO
    rows = []
    if constants.HF_HUB_OFFLINE:
        if model_cached(Path(constants.HF_HUB_CACHE), repo):
            rows.append(
                CheckRow("hub", "Hub offline mode", PASS, f"HF_HUB_OFFLINE set; {repo} is cached")
            )
        else:
            rows.append(
                CheckRow(
                    "hub",
                    "Hub offline mode",
                    WARN,
                    f"HF_HUB_OFFLINE set and {repo} is not in the cache: only local folders and "
                    "builtin models will work",
                    "unset HF_HUB_OFFLINE to download, or pass --model /path/to/MOSS-TTS",
                )
            )
    else:
        rows.append(CheckRow("hub", "Hub offline mode", PASS, "online (HF_HUB_OFFLINE not set)"))
    try:
        has_token = get_token() is not None
    except Exception:  # noqa: BLE001 - an unreadable token file counts as none
        has_token = False
    if has_token:
        source = "HF_TOKEN" if os.environ.get("HF_TOKEN") else "the token file"
        rows.append(CheckRow("hub", "Hub token", PASS, f"configured (from {source})"))
    else:
        rows.append(
            CheckRow(
                "hub",
                "Hub token",
                PASS,
                "none configured: public repos work, gated ones need a token",
                "for gated repos: `hf auth login` or export HF_TOKEN",
            )
        )
    return rows
