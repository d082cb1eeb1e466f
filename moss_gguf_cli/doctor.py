"""`doctor`: can this machine do the job? Named checks, each pass / warn / fail with a fix.

The checks cost seconds, so they run before work that costs minutes: ``moss-gguf doctor``
shows them all, and :func:`preflight` runs the ones that decide whether `all`, `quantize`
or `synth` can finish (an engine, the llama.cpp runtime, the output disk).

The llama.cpp runtime is checked by *running* it, in a child process so that a crash
cannot take the caller down: the child writes a tiny Qwen3 GGUF, quantizes it to Q8_0 and
Q4_K_M with libllama, and feeds each a few embedding rows through llama-cpp-python's
low-level API. A llama.cpp built with ``-march=native`` on a CPU that reports AMX dies of
SIGSEGV on the first quantized matmul; the child's death is caught and explained. The
result is cached per installed llama.cpp build (and CPU), so pre-flight pays it once.

Core code: nothing here prints; the CLI renders :class:`DoctorReport`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata as metadata
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import __version__
from . import llama_cpp as lc
from .cpu_features import REINSTALL_HINT, build_fit
from .errors import MossGgufError, OutputError, ToolError
from .progress import ProgressReporter, ensure
from .report import FAIL, PASS, WARN, CheckRows
from .staging import human_bytes

log = logging.getLogger(__name__)


GROUPS = ("versions", "engines", "runtime", "gpu", "disk", "hub")

# The fix for a llama.cpp that crashes on this CPU: a build without -march=native.
PORTABLE_BUILD_FIX = REINSTALL_HINT
TREE_PORTABLE_FIX = (
    "rebuild it with this CPU's flags: bash scripts/get-llama-cpp.sh "
    "(cmake with `python -m moss_gguf_cli.cpu_features`)"
)
RECHECK_HINT = "`moss-gguf doctor --recheck` runs it again"

# --------------------------------------------------------------------------- the real model

# docs/ARCHITECTURE.md §1: the real MOSS-TTS (8B); the disk plan is computed from these dims.
REAL_MODEL = {
    "repo_id": "OpenMOSS-Team/MOSS-TTS",
    "hidden": 4096,
    "intermediate": 12288,
    "layers": 36,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "vocab": 155648,
    "n_vq": 32,
    "audio_rows": 1025,  # audio vocab 1024 + the pad row
}


@dataclass(frozen=True)
class DiskPlan:
    """Bytes `all` writes for the real model, by part (the same sums as pipeline.plan_bytes)."""

    backbone_params: int
    source: int  # bf16 checkpoint in the Hub cache
    intermediate: int  # f16 GGUF in the work folder
    quantized: dict[str, int]  # per quant type
    tables: int  # f16 .npy embeddings and heads
    margin: int = 64 << 20

    @property
    def output(self) -> int:
        """Peak bytes beside --output (the work folder holds the intermediate until the end)."""
        return self.tables + self.intermediate + sum(self.quantized.values()) + self.margin

    def describe(self) -> str:
        quants = " + ".join(f"{q} {human_bytes(b)}" for q, b in self.quantized.items())
        return (
            f"tables {human_bytes(self.tables)} + f16 GGUF {human_bytes(self.intermediate)} + "
            f"{quants}"
        )


def model_plan(dims: dict[str, Any], quants: tuple[str, ...] = ("Q4_K_M",)) -> DiskPlan:
    """Bytes of each part `all` writes for a MOSS model of these dims (see REAL_MODEL)."""
    from .quantize import APPROX_BPW  # the bits per weight `all` plans its own disk with

    h, f, d = dims["hidden"], dims["intermediate"], dims["head_dim"]
    q, kv = dims["heads"] * d, dims["kv_heads"] * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h + 2 * d
    text = dims["vocab"] * h  # embed_tokens, and the text head of the same shape
    backbone = 2 * text + dims["layers"] * per_layer + h
    audio = 2 * dims["n_vq"] * dims["audio_rows"] * h  # emb_ext.* and lm_heads.1..n_vq
    return DiskPlan(
        backbone_params=backbone,
        source=2 * (backbone + audio),
        intermediate=2 * backbone,
        quantized={t: int(backbone * APPROX_BPW.get(t.upper(), 16) / 8) for t in quants},
        tables=2 * (2 * text + audio),
    )


def real_model_plan(quants: tuple[str, ...] = ("Q4_K_M",)) -> DiskPlan:
    """What `all --model OpenMOSS-Team/MOSS-TTS` needs, from the dims of docs/ARCHITECTURE.md §1."""
    return model_plan(REAL_MODEL, quants)


# --------------------------------------------------------------------------- report


@dataclass
class DoctorRow:
    group: str
    name: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""  # one line; what to do when it is not a pass


@dataclass
class DoctorReport(CheckRows):
    rows: list[DoctorRow] = field(default_factory=list)
    output: Path | None = None
    seconds: float = 0.0
    probe: ProbeResult | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts,
            "seconds": round(self.seconds, 3),
            "output": str(self.output) if self.output is not None else None,
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "runtime_probe": self.probe.to_dict() if self.probe is not None else None,
        }


# --------------------------------------------------------------------------- versions


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric part of a version: '2.13.0+cpu' -> (2, 13, 0)."""
    parts = []
    for piece in version.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    return tuple(parts)


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


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# (shown name, distribution, module, required, what it is for)
_PACKAGES = (
    ("numpy", "numpy", "numpy", True, "tables and heads"),
    ("gguf", "gguf", "gguf", True, "GGUF writing and reading"),
    ("safetensors", "safetensors", "safetensors", True, "checkpoint reading"),
    ("huggingface_hub", "huggingface_hub", "huggingface_hub", True, "Hub downloads"),
    ("tokenizers", "tokenizers", "tokenizers", True, "synth prompts"),
    ("soundfile", "soundfile", "soundfile", True, "WAV output"),
)


def _package_row(name: str, dist: str, module: str, required: bool, why: str) -> DoctorRow:
    version = _dist_version(dist)
    req = _requirements().get(_norm(dist))
    spec = f"{dist}{req[0]}{req[1]}" if req else dist
    fix = f"pip install '{spec}'"
    if version is None:
        status = FAIL if required else WARN
        return DoctorRow("versions", name, status, f"not installed (needed for {why})", fix)
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        return DoctorRow(
            "versions",
            name,
            FAIL if required else WARN,
            f"{version} is installed but does not import: {_one_line(exc)}",
            f"pip install --force-reinstall '{spec}'",
        )
    if req and not _satisfies(version, req):
        return DoctorRow(
            "versions", name, FAIL, f"{version}, moss-gguf needs {req[0]}{req[1]}", fix
        )
    return DoctorRow("versions", name, PASS, version)


def _satisfies(version: str, req: tuple[str, str]) -> bool:
    have, want = _release(version), _release(req[1])
    return have >= want if req[0] == ">=" else have[: len(want)] == want


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, MossGgufError):
        return exc.one_line()
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


def _error_row(group: str, name: str, exc: MossGgufError) -> DoctorRow:
    where = f"{exc.path}: " if exc.path else ""
    return DoctorRow(group, name, FAIL, f"{where}{exc.message}", exc.hint or "")


def _python_row() -> DoctorRow:
    version = platform.python_version()
    try:
        wanted = metadata.metadata("moss-gguf").get("Requires-Python") or ""
    except metadata.PackageNotFoundError:
        wanted = ""
    m = re.match(r"\s*>=\s*([\d.]+)", wanted)
    if m and _release(version) < _release(m.group(1)):
        return DoctorRow(
            "versions",
            "Python",
            FAIL,
            f"{version}, moss-gguf needs {wanted}",
            f"use Python {wanted} (e.g. a new virtual environment)",
        )
    return DoctorRow("versions", "Python", PASS, f"{version} ({sys.executable})")


def _onnxruntime_row() -> tuple[DoctorRow, list[str] | None]:
    row = _package_row("onnxruntime", "onnxruntime", "onnxruntime", True, "the audio codec")
    if row.status != PASS:
        return row, None
    import onnxruntime

    providers = list(onnxruntime.get_available_providers())
    row.detail += f"; providers: {', '.join(providers)}"
    return row, providers


def _torch_row() -> DoctorRow:
    # not imported: it takes seconds and only `verify --deep` needs it
    version = _dist_version("torch")
    if version is None or importlib.util.find_spec("torch") is None:
        return DoctorRow(
            "versions",
            "torch",
            WARN,
            "not installed (optional: only `verify --deep` needs it)",
            "pip install torch==2.13.0 (the CPU wheel is enough)",
        )
    return DoctorRow("versions", "torch", PASS, f"{version} (optional, for `verify --deep`)")


# --------------------------------------------------------------------------- libllama


def libllama_path() -> Path | None:
    """The libllama that `import llama_cpp` loads, found without importing (loading) it."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    base = Path(override) if override else Path(next(iter(spec.submodule_search_locations))) / "lib"
    if sys.platform == "darwin":
        names = ("libllama.so", "libllama.dylib")
    elif sys.platform == "win32":
        names = ("llama.dll", "libllama.dll")
    else:
        names = ("libllama.so",)
    for name in names:
        if (base / name).is_file():
            return (base / name).resolve()
    return None


def _cpu_info() -> dict[str, Any]:
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


def _cpu_id(cpu: dict[str, Any]) -> str:
    """Which CPU a probe result belongs to (a shared home folder may serve several machines)."""
    text = "|".join([platform.machine(), cpu["model"], " ".join(sorted(cpu["flags"]))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- runtime probe

PROBE_VERSION = 1  # bump when the probe changes what it checks
PROBE_TIMEOUT_S = 180
PROBE_QUANTS = ("Q8_0", "Q4_K_M")
# hidden states of a quantized model against the f16 one: far below means wrong numbers
PROBE_MIN_COSINE = {"Q8_0": 0.99, "Q4_K_M": 0.9}
# a tiny Qwen3: every row length a multiple of 256, so K-quants apply without fallbacks
PROBE_DIMS = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ff": 768, "layers": 2}
PROBE_VOCAB = 512
PROBE_ROWS = 8
_STAGES_FILE = "stages"
_RESULT_FILE = "result.json"


@dataclass
class ProbeResult:
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""
    seconds: float = 0.0
    cached: bool = False
    checked_at: str | None = None
    key: dict[str, Any] | None = None
    stage: str | None = None  # the last stage the child started
    returncode: int | None = None
    signal: str | None = None
    cosine: dict[str, float] = field(default_factory=dict)
    cacheable: bool = False  # a property of the build (not of a busy or full machine)

    @property
    def crashed(self) -> bool:
        return self.signal is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def probe_key() -> dict[str, Any] | None:
    """What identifies the installed llama.cpp build; None when llama-cpp-python is absent."""
    lib = libllama_path()
    if lib is None:
        return None
    st = lib.stat()
    return {
        "probe_version": PROBE_VERSION,
        "llama_cpp_python": _dist_version("llama_cpp_python"),
        "libllama": str(lib),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "cpu": _cpu_id(_cpu_info()),
    }


def probe_cache_path(key: dict[str, Any]) -> Path:
    """Where the probe result of this build is kept, under the moss-gguf cache."""
    from .tiny import cache_root

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "doctor" / f"llama-runtime-{digest}.json"


def read_cached_probe(key: dict[str, Any]) -> ProbeResult | None:
    path = probe_cache_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        result = ProbeResult.from_dict(data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    result.cached = True
    return result


def _write_cache(result: ProbeResult) -> None:
    assert result.key is not None
    path = probe_cache_path(result.key)
    tmp = path.parent / f".{path.name}.partial-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache only costs the next run a probe
        log.debug("cannot cache the runtime probe at %s: %s", path, exc)
        tmp.unlink(missing_ok=True)


def build_probe_cmd(workdir: Path) -> list[str]:
    """The child that checks the runtime: this module's probe_child_main in a fresh Python.

    The package's folder is appended to the child's path (not prepended: it may be
    site-packages, which must not shadow the standard library), so a source checkout works too.
    """
    package_parent = str(Path(__file__).resolve().parent.parent)
    code = (
        "import sys; sys.path.append(sys.argv[1]); "
        "from moss_gguf_cli.doctor import probe_child_main; "
        "sys.exit(probe_child_main(sys.argv[2]))"
    )
    return [sys.executable, "-c", code, package_parent, str(workdir)]


def run_probe(
    build_cmd: Callable[[Path], list[str]] = build_probe_cmd,
    *,
    timeout: float = PROBE_TIMEOUT_S,
) -> ProbeResult:
    """Run the probe child once (no cache) and explain how it ended."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="moss-gguf-probe-") as tmp:
        workdir = Path(tmp)
        cmd = build_cmd(workdir)
        log.debug("runtime probe: %s", " ".join(cmd))
        try:
            done = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                check=False,
            )
        except subprocess.TimeoutExpired:
            stage = _last_stage(workdir)
            return ProbeResult(
                FAIL,
                f"the llama.cpp runtime check did not finish in {timeout:.0f} s "
                f"(stuck in: {stage or 'start-up'})",
                "rerun when the machine is less busy; if it hangs again, reinstall "
                f"llama-cpp-python: {PORTABLE_BUILD_FIX}",
                seconds=time.perf_counter() - started,
                stage=stage,
            )
        except OSError as exc:
            return ProbeResult(
                WARN,
                f"cannot start the llama.cpp runtime check: {exc.strerror or exc}",
                "check that this Python can start itself as a subprocess",
                seconds=time.perf_counter() - started,
            )
        tail = done.stderr.decode("utf-8", "replace").splitlines()
        result = interpret_probe(done.returncode, _last_stage(workdir), _read_result(workdir), tail)
    result.seconds = time.perf_counter() - started
    return result


def _last_stage(workdir: Path) -> str | None:
    try:
        lines = (workdir / _STAGES_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    return lines[-1].strip() if lines else None


def _read_result(workdir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((workdir / _RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def interpret_probe(
    returncode: int, stage: str | None, result: dict[str, Any] | None, stderr_tail: list[str]
) -> ProbeResult:
    """Turn how the child ended into a status, a detail and a one-line fix."""
    where = f" while {stage}" if stage else " while starting"
    if returncode < 0:
        name = _signal_name(returncode)
        if name in ("SIGSEGV", "SIGILL", "SIGBUS"):
            why = (
                "instructions this CPU does not have"
                if name == "SIGILL"
                else "e.g. built with -march=native on a CPU reporting AMX: every quantized "
                "matmul segfaults"
            )
            return ProbeResult(
                FAIL,
                f"llama.cpp crashed ({name}){where}: this llama-cpp-python build does not run "
                f"on this CPU ({why})",
                f"reinstall a portable build: {PORTABLE_BUILD_FIX}",
                stage=stage,
                returncode=returncode,
                signal=name,
                cacheable=True,
            )
        if name == "SIGABRT":
            last = lc.last_lines(stderr_tail, 2)
            return ProbeResult(
                FAIL,
                f"llama.cpp aborted (SIGABRT){where}: {last}",
                f"reinstall llama-cpp-python: {PORTABLE_BUILD_FIX}",
                stage=stage,
                returncode=returncode,
                signal=name,
                cacheable=True,
            )
        if name == "SIGKILL":
            return ProbeResult(
                FAIL,
                f"the llama.cpp runtime check was killed (SIGKILL){where}, most likely out of "
                "memory",
                "free some memory (close other programs) and rerun",
                stage=stage,
                returncode=returncode,
                signal=name,
            )
        return ProbeResult(
            FAIL,
            f"the llama.cpp runtime check died of {name}{where}",
            f"rerun; if it happens again reinstall llama-cpp-python: {PORTABLE_BUILD_FIX}",
            stage=stage,
            returncode=returncode,
            signal=name,
        )
    if result is None:
        return ProbeResult(
            FAIL,
            f"the llama.cpp runtime check exited with code {returncode}{where}: "
            f"{lc.last_lines(stderr_tail, 2)}",
            "rerun with MOSS_GGUF_DEBUG=1; reinstall moss-gguf and llama-cpp-python if it persists",
            stage=stage,
            returncode=returncode,
        )
    kind = result.get("kind")
    if result.get("ok") and returncode == 0:
        cos = {k: float(v) for k, v in (result.get("cosine") or {}).items()}
        shown = ", ".join(f"{k} {v:.4f}" for k, v in cos.items())
        return ProbeResult(
            PASS,
            f"f16, {' and '.join(PROBE_QUANTS)} of a tiny Qwen3 quantized by libllama and "
            f"decoded from {PROBE_ROWS} embedding rows; hidden-state cosine to f16: {shown}",
            stage=stage,
            returncode=returncode,
            cosine=cos,
            cacheable=True,
        )
    error = str(result.get("error") or "unknown error")
    if kind == "missing":
        return ProbeResult(
            FAIL,
            f"llama-cpp-python does not import: {error}",
            f"install it (portable build): {PORTABLE_BUILD_FIX}",
            stage=stage,
            returncode=returncode,
        )
    if kind == "llama":
        return ProbeResult(
            FAIL,
            f"llama.cpp failed{where}: {error}",
            f"reinstall llama-cpp-python: {PORTABLE_BUILD_FIX}",
            stage=stage,
            returncode=returncode,
            cacheable=True,
        )
    # the machine, not llama.cpp: a full temp disk, no memory…
    return ProbeResult(
        WARN,
        f"the llama.cpp runtime check could not run{where}: {error}",
        "free space in the temp folder ($TMPDIR) and memory, then rerun",
        stage=stage,
        returncode=returncode,
    )


def runtime_probe(
    *,
    recheck: bool = False,
    timeout: float = PROBE_TIMEOUT_S,
    build_cmd: Callable[[Path], list[str]] = build_probe_cmd,
) -> ProbeResult:
    """The probe result for the installed llama.cpp build: cached, else run (and cached)."""
    key = probe_key()
    if key is None:
        detail = (
            "llama-cpp-python is not installed"
            if importlib.util.find_spec("llama_cpp") is None
            else "llama-cpp-python is installed without its libllama"
        )
        return ProbeResult(FAIL, detail, f"install it (portable build): {PORTABLE_BUILD_FIX}")
    if not recheck:
        cached = read_cached_probe(key)
        if cached is not None:
            return cached
    result = run_probe(build_cmd, timeout=timeout)
    result.key = key
    result.checked_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if result.cacheable:
        _write_cache(result)
    return result


def _probe_detail(p: ProbeResult) -> str:
    if p.cached:
        when = f" on {p.checked_at}" if p.checked_at else ""
        return f"{p.detail} (result cached{when} for this llama.cpp build; {RECHECK_HINT})"
    return f"{p.detail} (ran in {p.seconds:.1f} s)"


# -- the child


def write_probe_gguf(path: Path, seed: int = 20260202) -> Path:
    """A tiny random Qwen3 f16 GGUF that llama.cpp loads (gpt2-style vocabulary of stubs)."""
    import gguf
    import numpy as np

    d = PROBE_DIMS
    h, hd = d["hidden"], d["head_dim"]
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        w = rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
        return w.astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name("moss-gguf doctor probe")
    w.add_block_count(d["layers"])
    w.add_context_length(64)
    w.add_embedding_length(h)
    w.add_feed_forward_length(d["ff"])
    w.add_head_count(d["heads"])
    w.add_head_count_kv(d["kv_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # llama.cpp wants a vocabulary as long as token_embd; the probe never tokenizes text
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"t{i}" for i in range(PROBE_VOCAB - 1)] + ["t1t1"])
    w.add_token_types([gguf.TokenType.NORMAL] * PROBE_VOCAB)
    w.add_token_merges(["t1 t1"])
    w.add_tensor("token_embd.weight", (0.5 * rng.standard_normal((PROBE_VOCAB, h))).astype("f2"))
    q, kv = d["heads"] * hd, d["kv_heads"] * hd
    for i in range(d["layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(h))
        w.add_tensor(p + "attn_q.weight", mat(q, h))
        w.add_tensor(p + "attn_k.weight", mat(kv, h))
        w.add_tensor(p + "attn_v.weight", mat(kv, h))
        w.add_tensor(p + "attn_output.weight", mat(h, q))
        w.add_tensor(p + "attn_q_norm.weight", norm(hd))
        w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        w.add_tensor(p + "ffn_norm.weight", norm(h))
        w.add_tensor(p + "ffn_gate.weight", mat(d["ff"], h))
        w.add_tensor(p + "ffn_up.weight", mat(d["ff"], h))
        w.add_tensor(p + "ffn_down.weight", mat(h, d["ff"]))
    w.add_tensor("output_norm.weight", norm(h))
    w.add_tensor("output.weight", mat(PROBE_VOCAB, h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class _LlamaFailure(Exception):
    """llama.cpp itself refused (not the machine around it)."""


def _decode_rows(llama_cpp: Any, gguf_path: Path, rows: Any) -> Any:
    """Hidden states of rows (n × n_embd) fed as embeddings: a prefill, then one more step."""
    import numpy as np

    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0  # the CPU kernels are what a native build breaks
    model = llama_cpp.llama_model_load_from_file(str(gguf_path).encode(), mparams)
    if not model:
        raise _LlamaFailure(f"cannot load {gguf_path.name}")
    ctx = batch = None
    try:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = 64
        cparams.n_batch = cparams.n_ubatch = 16
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = max(1, min(4, os.cpu_count() or 1))
        cparams.embeddings = True
        cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        cparams.no_perf = True
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise _LlamaFailure("cannot create a context")
        n_embd = int(llama_cpp.llama_model_n_embd(model))
        n = rows.shape[0]
        batch = llama_cpp.llama_batch_init(n, n_embd, 1)
        out = np.empty((n, n_embd), dtype=np.float32)
        # several rows (matrix-matrix kernels), then one (matrix-vector), as synth does
        for start, stop in ((0, n - 1), (n - 1, n)):
            m = stop - start
            batch.n_tokens = m
            embd = np.ctypeslib.as_array(batch.embd, shape=(n, n_embd))
            embd[:m] = rows[start:stop]
            for i in range(m):
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise _LlamaFailure(f"llama_decode returned {rc}")
            for i in range(m):
                ptr = llama_cpp.llama_get_embeddings_ith(ctx, i)
                if not ptr:
                    raise _LlamaFailure("no hidden state returned")
                out[start + i] = np.ctypeslib.as_array(ptr, shape=(n_embd,))
        return out
    finally:
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def probe_child_main(workdir: str | Path) -> int:
    """Runs in the child: every stage is recorded before it starts, for a crash to name."""
    import numpy as np

    workdir = Path(workdir)
    fd = os.open(workdir / _STAGES_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def stage(name: str) -> None:
        os.write(fd, (name + "\n").encode())  # unbuffered: survives a segfault

    def finish(data: dict[str, Any], code: int) -> int:
        tmp = workdir / f".{_RESULT_FILE}.tmp"
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, workdir / _RESULT_FILE)
        return code

    current = "start-up"
    try:
        current = "importing llama_cpp"
        stage(current)
        try:
            import llama_cpp

            llama_cpp.llama_backend_init()
        except Exception as exc:  # noqa: BLE001 - a broken install raises anything
            return finish({"ok": False, "kind": "missing", "error": _one_line(exc)}, 5)
        from .quantize import quantize

        current = "writing the f16 probe GGUF"
        stage(current)
        f16 = write_probe_gguf(workdir / "probe_f16.gguf")
        rows = 0.5 * np.random.default_rng(7).standard_normal((PROBE_ROWS, PROBE_DIMS["hidden"]))
        rows = rows.astype(np.float32)
        current = "decoding the f16 model"
        stage(current)
        base = _decode_rows(llama_cpp, f16, rows)
        cosine: dict[str, float] = {}
        for qtype in PROBE_QUANTS:
            current = f"quantizing to {qtype} (libllama)"
            stage(current)
            out = workdir / f"probe_{qtype.lower()}.gguf"
            try:
                quantize(f16, out, qtype, engine="library", threads=2)
            except MossGgufError as exc:
                raise _LlamaFailure(exc.message) from exc
            current = f"decoding the {qtype} model"
            stage(current)
            hidden = _decode_rows(llama_cpp, out, rows)
            if not np.isfinite(hidden).all():
                raise _LlamaFailure(f"the {qtype} model returned NaN/Inf hidden states")
            num = (hidden * base).sum(axis=1)
            den = np.linalg.norm(hidden, axis=1) * np.linalg.norm(base, axis=1)
            cos = float(np.min(num / np.maximum(den, 1e-30)))
            cosine[qtype] = cos
            if cos < PROBE_MIN_COSINE[qtype]:
                raise _LlamaFailure(
                    f"the {qtype} model computes wrong numbers (hidden-state cosine to f16 "
                    f"{cos:.3f} < {PROBE_MIN_COSINE[qtype]})"
                )
        if not np.isfinite(base).all():
            raise _LlamaFailure("the f16 model returned NaN/Inf hidden states")
        current = "done"
        stage(current)
        return finish({"ok": True, "cosine": cosine}, 0)
    except _LlamaFailure as exc:
        return finish({"ok": False, "kind": "llama", "stage": current, "error": str(exc)}, 3)
    except Exception as exc:  # noqa: BLE001 - explained by the parent
        error = f"{type(exc).__name__}: {_one_line(exc)}"
        return finish({"ok": False, "kind": "environment", "stage": current, "error": error}, 4)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- engines


def resolve_engine(engine: str, llama_cpp: Path | None) -> tuple[str, Path | None]:
    """Which engine `quantize --engine ENGINE` would use, and its binary: quantize's own rules."""
    from .quantize import parse_engine
    from .quantize import resolve_engine as resolve

    resolved, exe = resolve(parse_engine(engine), llama_cpp)
    return resolved.value, exe


def _binary_row(llama_cpp: Path | None, workdir: Path) -> DoctorRow:
    try:
        tree = lc.find_llama_cpp(llama_cpp)
    except ToolError as exc:
        return _error_row("engines", "llama-quantize", exc)
    if tree is None or tree.quantize_bin is None:
        where = f" in {tree.root} ({tree.source})" if tree and tree.root else ""
        return DoctorRow(
            "engines",
            "llama-quantize",
            WARN,
            f"not found{where} (--llama-cpp, $LLAMA_CPP_DIR, PATH); the libllama engine "
            "does the same work",
            lc.GET_SCRIPT_HINT,
        )
    exe = tree.quantize_bin
    # run it on the probe model: it shows its build, and that it runs at all
    src = write_probe_gguf(workdir / "binary_f16.gguf")
    cmd = lc.build_quantize_cmd(exe, src, workdir / "binary_q8_0.gguf", "Q8_0")
    parser = lc.QuantizeLogParser()
    try:
        run = lc.run_streaming(cmd, parser.feed)
    except ToolError as exc:
        return DoctorRow("engines", "llama-quantize", FAIL, exc.message, lc.GET_SCRIPT_HINT)
    parser.close()
    if run.returncode < 0:
        name = _signal_name(run.returncode)
        return DoctorRow(
            "engines",
            "llama-quantize",
            FAIL,
            f"{exe} crashed ({name}) quantizing a tiny model: it was built for another CPU",
            TREE_PORTABLE_FIX,
        )
    if run.returncode != 0:
        return DoctorRow(
            "engines",
            "llama-quantize",
            FAIL,
            f"{exe} failed (exit {run.returncode}): {lc.last_lines(run.tail, 2)}",
            lc.GET_SCRIPT_HINT,
        )
    version = parser.build or (lc.tree_version(tree.root) if tree.root else None)
    shown = version.describe().removeprefix("llama-quantize, ") if version else "version unknown"
    return DoctorRow("engines", "llama-quantize", PASS, f"{exe} ({tree.source}; {shown})")


def _library_row(probe: ProbeResult, safe_import: bool) -> DoctorRow:
    version = _dist_version("llama_cpp_python")
    if version is None:
        return DoctorRow(
            "engines",
            "libllama",
            FAIL,
            "llama-cpp-python is not installed (needed by synth, and by quantize without "
            "llama-quantize)",
            f"install it (portable build): {PORTABLE_BUILD_FIX}",
        )
    quantized = probe.status == PASS or (
        probe.stage is not None and probe.stage.startswith("decoding the Q")
    )
    if not quantized:
        status = WARN if probe.status == WARN else FAIL  # WARN: the machine, not llama.cpp
        detail = f"llama_model_quantize not checked: {probe.detail}"
        return DoctorRow("engines", "libllama", status, detail, probe.fix)
    lib = libllama_path()
    build = lc.library_version() if safe_import else None
    shown = build.describe() if build else f"llama-cpp-python {version}"
    return DoctorRow("engines", "libllama", PASS, f"llama_model_quantize in {shown} ({lib})")


def _auto_row(llama_cpp: Path | None, safe_import: bool) -> DoctorRow:
    try:
        tree = lc.find_llama_cpp(llama_cpp)
    except MossGgufError as exc:
        return _error_row("engines", "auto engine", exc)
    if not safe_import and (tree is None or tree.quantize_bin is None):
        return DoctorRow(
            "engines",
            "auto engine",
            FAIL,
            "no usable engine: no llama-quantize, and importing llama-cpp-python crashed",
            f"reinstall a portable build: {PORTABLE_BUILD_FIX}",
        )
    try:
        engine, exe = resolve_engine("auto", llama_cpp)
    except MossGgufError as exc:
        return _error_row("engines", "auto engine", exc)
    what = f"binary ({exe})" if exe else "library (llama-cpp-python's libllama, in-process)"
    return DoctorRow("engines", "auto engine", PASS, f"`--engine auto` uses {what}")


# --------------------------------------------------------------------------- GPU and CPU


def _ggml_devices(llama_cpp: Any) -> list[dict[str, Any]]:
    """ggml's backend devices (name, description, type, memory) through libllama's handle."""
    import ctypes

    lib = llama_cpp.llama_cpp._lib
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


def _nvidia_gpus() -> list[str]:
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


def _gpu_rows(safe_import: bool, providers: list[str] | None) -> list[DoctorRow]:
    nvidia = _nvidia_gpus()
    seen = f"; the driver reports {', '.join(nvidia)}" if nvidia else ""
    rows = []
    if not safe_import or _dist_version("llama_cpp_python") is None:
        rows.append(
            DoctorRow("gpu", "llama.cpp GPU", WARN, "not checked: llama-cpp-python unusable")
        )
    else:
        import llama_cpp

        llama_cpp.llama_backend_init()
        offload = bool(llama_cpp.llama_supports_gpu_offload())
        devices = _ggml_devices(llama_cpp)
        gpus = [d for d in devices if d["type"] in ("GPU", "iGPU")]
        listed = "; ".join(
            f"{d['name']} {d['description']} ({human_bytes(d['total'])})" for d in gpus
        )
        if gpus:
            rows.append(DoctorRow("gpu", "llama.cpp GPU", PASS, f"GPU offload: {listed}"))
        elif offload:
            rows.append(
                DoctorRow(
                    "gpu",
                    "llama.cpp GPU",
                    WARN,
                    f"built with GPU offload but no GPU device is visible{seen}",
                    "check the GPU driver and CUDA_VISIBLE_DEVICES (or set n_gpu_layers: 0)",
                )
            )
        elif nvidia:
            rows.append(
                DoctorRow(
                    "gpu",
                    "llama.cpp GPU",
                    WARN,
                    f"CPU only: this llama-cpp-python has no GPU backend{seen}",
                    'for GPU speed: CMAKE_ARGS="-DGGML_CUDA=on -DGGML_NATIVE=OFF" pip install '
                    "--force-reinstall --no-cache-dir llama-cpp-python",
                )
            )
        else:
            rows.append(DoctorRow("gpu", "llama.cpp GPU", PASS, "CPU only (no GPU backend)"))
    if providers is None:
        rows.append(DoctorRow("gpu", "onnxruntime GPU", WARN, "not checked: onnxruntime unusable"))
    elif "CUDAExecutionProvider" in providers:
        rows.append(DoctorRow("gpu", "onnxruntime GPU", PASS, "CUDA (CUDAExecutionProvider)"))
    elif nvidia:
        rows.append(
            DoctorRow(
                "gpu",
                "onnxruntime GPU",
                WARN,
                f"CPU only: no CUDAExecutionProvider{seen}",
                "for use_gpu_audio: pip uninstall onnxruntime && pip install onnxruntime-gpu",
            )
        )
    else:
        rows.append(DoctorRow("gpu", "onnxruntime GPU", PASS, "CPU only (no CUDA provider)"))
    return rows


def _cpu_row(probe: ProbeResult, safe_import: bool) -> DoctorRow:
    cpu = _cpu_info()
    amx = sorted(f for f in cpu["flags"] if f.startswith("amx"))
    detail = f"{cpu['model']}, {os.cpu_count()} cores"
    if amx:
        detail += f", reports {'/'.join(amx)}"
    system_info = None
    if safe_import and _dist_version("llama_cpp_python") is not None:
        import llama_cpp

        system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    if amx and probe.crashed:
        return DoctorRow("runtime", "CPU", FAIL, detail, probe.fix)
    if system_info is None:
        return DoctorRow("runtime", "CPU", PASS, detail)
    return cpu_fit_row(detail, system_info, cpu["flags"])


def cpu_fit_row(detail: str, system_info: str, flags: list[str]) -> DoctorRow:
    """Whether the instruction sets llama.cpp was compiled with match this CPU's flags."""
    fit = build_fit(system_info, flags)
    detail += f"; llama.cpp uses {' '.join(fit.used) or 'no SIMD extensions'}"
    if fit.missing:
        missing = " ".join(fit.missing)
        return DoctorRow(
            "runtime", "CPU", FAIL,
            f"{detail}; this CPU lacks {missing}: illegal instruction on first use",
            f"rebuild for this CPU: {REINSTALL_HINT}",
        )  # fmt: skip
    if fit.amx:
        return DoctorRow(
            "runtime", "CPU", WARN,
            f"{detail}; AMX is compiled in (that build crashed on quantized matmuls)",
            f"rebuild without AMX: {REINSTALL_HINT}",
        )  # fmt: skip
    if fit.unused:
        return DoctorRow(
            "runtime", "CPU", WARN,
            f"{detail}; matches this CPU, which also has {' '.join(fit.unused)} (slower)",
            f"rebuild for this CPU: {REINSTALL_HINT}",
        )  # fmt: skip
    return DoctorRow("runtime", "CPU", PASS, f"{detail}; matches this CPU")


# --------------------------------------------------------------------------- disk


def _existing(path: Path) -> Path:
    probe = Path(path).expanduser().absolute()
    while not probe.exists():
        probe = probe.parent
    return probe


def disk_check(output: Path, needed: int, what: str, breakdown: str = "") -> DoctorRow:
    """Free space (and writability) where output will be, against the needed bytes."""
    where = _existing(output)
    free = shutil.disk_usage(where).free
    if not os.access(where, os.W_OK):
        return DoctorRow(
            "disk", "output disk", FAIL, f"{where} is not writable", "choose a writable --output"
        )
    parts = f" ({breakdown})" if breakdown else ""
    if free < needed:
        return DoctorRow(
            "disk",
            "output disk",
            FAIL,
            f"{what} needs {human_bytes(needed)} of free disk, only {human_bytes(free)} "
            f"available at {where}{parts}",
            "free some disk or choose an --output on a larger disk",
        )
    return DoctorRow(
        "disk",
        "output disk",
        PASS,
        f"{human_bytes(free)} free at {where}; {what} needs {human_bytes(needed)}{parts}",
    )


def _model_cached(hub_cache: Path, repo_id: str) -> bool:
    snapshots = hub_cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return any(snapshots.glob("*/config.json"))


def _disk_rows(output: Path) -> list[DoctorRow]:
    from huggingface_hub import constants

    plan = real_model_plan()
    repo = REAL_MODEL["repo_id"]
    breakdown = (
        f"{plan.describe()}; from the dims of its {plan.backbone_params / 1e9:.1f} B backbone "
        "parameters, default --quant Q4_K_M; the source goes to the Hub cache"
    )
    out_row = disk_check(output, plan.output, f"`all --model {repo}`", breakdown)
    hub = Path(constants.HF_HUB_CACHE)
    cached = _model_cached(hub, repo)
    hub_where = _existing(hub)
    hub_free = shutil.disk_usage(hub_where).free
    same_disk = hub_where.stat().st_dev == _existing(output).stat().st_dev
    left = hub_free - (plan.output if same_disk else 0)
    offline = " (offline mode)" if constants.HF_HUB_OFFLINE else ""
    detail = f"{hub}{offline}, {human_bytes(hub_free)} free"
    if cached:
        row = DoctorRow("disk", "Hub cache", PASS, f"{detail}; {repo} is already there")
    elif left < plan.source:
        shared = " after the output's share (same disk)" if same_disk else ""
        row = DoctorRow(
            "disk",
            "Hub cache",
            WARN,
            f"{detail}; downloading {repo} needs {human_bytes(plan.source)}{shared}",
            "free some disk, set HF_HUB_CACHE to a larger disk, or pass --model a local folder",
        )
    else:
        row = DoctorRow(
            "disk",
            "Hub cache",
            PASS,
            f"{detail}; room for the {human_bytes(plan.source)} download of {repo}",
        )
    return [out_row, row]


# --------------------------------------------------------------------------- hub


def _hub_rows() -> list[DoctorRow]:
    from huggingface_hub import constants, get_token

    repo = REAL_MODEL["repo_id"]
    rows = []
    if constants.HF_HUB_OFFLINE:
        if _model_cached(Path(constants.HF_HUB_CACHE), repo):
            rows.append(
                DoctorRow("hub", "Hub offline mode", PASS, f"HF_HUB_OFFLINE set; {repo} is cached")
            )
        else:
            rows.append(
                DoctorRow(
                    "hub",
                    "Hub offline mode",
                    WARN,
                    f"HF_HUB_OFFLINE set and {repo} is not in the cache: only local folders and "
                    "builtin models will work",
                    "unset HF_HUB_OFFLINE to download, or pass --model /path/to/MOSS-TTS",
                )
            )
    else:
        rows.append(DoctorRow("hub", "Hub offline mode", PASS, "online (HF_HUB_OFFLINE not set)"))
    try:
        has_token = get_token() is not None
    except Exception:  # noqa: BLE001 - an unreadable token file counts as none
        has_token = False
    if has_token:
        source = "HF_TOKEN" if os.environ.get("HF_TOKEN") else "the token file"
        rows.append(DoctorRow("hub", "Hub token", PASS, f"configured (from {source})"))
    else:
        rows.append(
            DoctorRow(
                "hub",
                "Hub token",
                PASS,
                "none configured: public repos work, gated ones need a token",
                "for gated repos: `hf auth login` or export HF_TOKEN",
            )
        )
    return rows


# --------------------------------------------------------------------------- doctor


def doctor(
    *,
    output: Path | None = None,
    llama_cpp: Path | None = None,
    recheck: bool = False,
    progress: ProgressReporter | None = None,
) -> DoctorReport:
    """Every check, in order; a crash of llama.cpp is confined to the probe's child."""
    started = time.perf_counter()
    bar = ensure(progress)
    output = Path(output) if output is not None else Path.cwd()
    report = DoctorReport(output=output)
    steps = ("llama.cpp runtime probe", "versions", "engines", "GPU", "disk", "Hub")
    bar.start("doctor", "doctor", len(steps), "checks")

    def step(i: int) -> None:
        bar.advance("doctor", 1 if i else 0, description=f"doctor: {steps[i]}")

    # 1. first, in a child: whether importing and running llama.cpp is safe at all
    step(0)
    probe = runtime_probe(recheck=recheck)
    report.probe = probe
    safe_import = not (probe.crashed and probe.stage == "importing llama_cpp")
    safe_import = safe_import and _dist_version("llama_cpp_python") is not None

    step(1)
    rows = report.rows
    rows.append(DoctorRow("versions", "moss-gguf", PASS, __version__))
    rows.append(_python_row())
    rows += [_package_row(*p) for p in _PACKAGES[:4]]
    rows.append(_llama_cpp_python_row(probe, safe_import))
    ort_row, providers = _onnxruntime_row()
    rows.append(ort_row)
    rows += [_package_row(*p) for p in _PACKAGES[4:]]
    rows.append(_torch_row())

    step(2)
    with tempfile.TemporaryDirectory(prefix="moss-gguf-doctor-") as tmp:
        rows.append(_binary_row(llama_cpp, Path(tmp)))
    rows.append(_library_row(probe, safe_import))
    rows.append(_auto_row(llama_cpp, safe_import))
    rows.append(
        DoctorRow("runtime", "llama.cpp runtime", probe.status, _probe_detail(probe), probe.fix)
    )
    rows.append(_cpu_row(probe, safe_import))

    step(3)
    rows += _gpu_rows(safe_import, providers)
    step(4)
    rows += _disk_rows(output)
    step(5)
    rows += _hub_rows()
    bar.advance("doctor", 1, description="doctor: done")
    bar.finish("doctor")
    report.seconds = time.perf_counter() - started
    return report


def _llama_cpp_python_row(probe: ProbeResult, safe_import: bool) -> DoctorRow:
    version = _dist_version("llama_cpp_python")
    if version is None:
        return DoctorRow(
            "versions",
            "llama-cpp-python",
            FAIL,
            "not installed (synth's backbone; quantize without llama-quantize)",
            f"install it (portable build): {PORTABLE_BUILD_FIX}",
        )
    if not safe_import:
        return DoctorRow(
            "versions",
            "llama-cpp-python",
            FAIL,
            f"{version}: importing it crashed ({probe.signal})",
            probe.fix,
        )
    try:
        build = lc.library_version()
    except Exception as exc:  # noqa: BLE001
        build = None
        log.debug("llama.cpp version unavailable: %s", exc)
    if build is None:
        return DoctorRow(
            "versions",
            "llama-cpp-python",
            FAIL,
            f"{version} is installed but does not import",
            f"reinstall it (portable build): {PORTABLE_BUILD_FIX}",
        )
    parts = [f"commit {build.commit}" if build.commit else None]
    parts += [f"llama {build.llama_version}" if build.llama_version else None]
    parts += [f"ggml {build.ggml_version}" if build.ggml_version else None]
    carried = ", ".join(p for p in parts if p) or "build unknown"
    return DoctorRow("versions", "llama-cpp-python", PASS, f"{version} (llama.cpp {carried})")


# --------------------------------------------------------------------------- pre-flight


def preflight(
    *,
    needs_quantize: bool,
    output: Path | None,
    needed_bytes: int | None,
    llama_cpp: Path | None,
    engine: str,
    needs_runtime: bool = False,
) -> None:
    """The doctor's fast checks before long work; raises with the doctor's one-line fix.

    - needs_quantize: a quantize engine must exist (quantize's own resolution: ENGINE,
      --llama-cpp, $LLAMA_CPP_DIR, PATH); when it is libllama, the runtime probe must pass.
    - needs_runtime: libllama must run here (synth; `all`, whose output is for synth).
    - output + needed_bytes: the disk of output's folder (where `all` also keeps its work
      folder) must hold needed_bytes; checked when both are given.

    The probe runs once per installed llama.cpp build (cached); a passing build costs a
    file read. Nothing is written besides that cache.
    """
    from .quantize import Engine
    from .quantize import parse_engine as _parse_engine

    probe_needed = needs_runtime
    if needs_quantize:
        eng = _parse_engine(engine)
        if eng is not Engine.BINARY:
            # find the binary without importing llama_cpp: the import itself may crash
            tree = lc.find_llama_cpp(llama_cpp)
            has_binary = tree is not None and tree.quantize_bin is not None
            if eng is Engine.LIBRARY or not has_binary:
                if importlib.util.find_spec("llama_cpp") is None:
                    resolve_engine(eng.value, llama_cpp)  # raises quantize's own message
                probe_needed = True
    if probe_needed:
        probe = runtime_probe()
        if probe.status == FAIL:
            note = f"; {RECHECK_HINT}" if probe.cached else ""
            raise ToolError(
                f"llama.cpp runtime check failed: {probe.detail}", hint=probe.fix + note
            )
        if probe.status == WARN:
            log.warning("%s (%s)", probe.detail, probe.fix)
    if needs_quantize:
        resolve_engine(engine, llama_cpp)
    if output is not None and needed_bytes:
        row = disk_check(Path(output).parent, int(needed_bytes), "this run")
        if row.status == FAIL:
            raise OutputError(row.detail, path=output, hint=row.fix)


def quantize_bytes(n_elements: int, file_types: list[str]) -> int:
    """Rough output bytes of quantizing n_elements weights to each type (for pre-flight)."""
    from .quantize import APPROX_BPW

    margin = 16 << 20  # header and vocabulary: ~7 MB for the real 155k-token one
    return int(sum(n_elements * APPROX_BPW.get(t.upper(), 16) / 8 for t in file_types)) + margin
