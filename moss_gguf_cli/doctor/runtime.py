"""The llama.cpp runtime probe: run libllama in a child process, so that a crash cannot take
the caller down, and explain how the child ended; cached per installed build (and CPU).

The child writes a tiny Qwen3 GGUF, quantizes it to Q8_0 and Q4_K_M with libllama, and feeds
each a few embedding rows through llama-cpp-python's low-level API. A llama.cpp built with
``-march=native`` on a CPU that reports AMX dies of SIGSEGV on the first quantized matmul.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
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

from ..errors import MossGgufError
from ..native import libllama
from ..native import llama_tools as lc
from ..native.cpu_features import REINSTALL_HINT
from ..quantize.engines import Engine
from ..quantize.llama import quantize
from ..report import FAIL, PASS, WARN
from ..source.tiny import cache_root
from .environment import cpu_id, cpu_info, dist_version, one_line

log = logging.getLogger(__name__)


# The fix for a llama.cpp that crashes on this CPU: a build without -march=native.
PORTABLE_BUILD_FIX = REINSTALL_HINT


RECHECK_HINT = "`moss-gguf doctor --recheck` runs it again"


PROBE_VERSION = 1  # bump when the probe changes what it checks


PROBE_TIMEOUT_S = 180


PROBE_FILE_TYPES = ("Q8_0", "Q4_K_M")


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
    lib = libllama.library_path()
    if lib is None:
        return None
    st = lib.stat()
    return {
        "probe_version": PROBE_VERSION,
        "llama_cpp_python": dist_version("llama_cpp_python"),
        "libllama": str(lib),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "cpu": cpu_id(cpu_info()),
    }


def probe_cache_path(key: dict[str, Any]) -> Path:
    """Where the probe result of this build is kept, under the moss-gguf cache."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "doctor" / f"llama-runtime-{digest}.json"


def read_cached_probe(key: dict[str, Any]) -> ProbeResult | None:
    path = probe_cache_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        result = ProbeResult.from_dict(data)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
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
    package_parent = str(Path(__file__).resolve().parents[2])  # doctor/ is inside the package
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
    except (OSError, ValueError, RecursionError):
        return None


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _killed(
    name: str, returncode: int, stage: str | None, where: str, stderr_tail: list[str]
) -> ProbeResult:
    """The child died of signal NAME: a build that does not run here, or the machine."""
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


def interpret_probe(
    returncode: int, stage: str | None, result: dict[str, Any] | None, stderr_tail: list[str]
) -> ProbeResult:
    """Turn how the child ended into a status, a detail and a one-line fix."""
    where = f" while {stage}" if stage else " while starting"
    if returncode < 0:
        return _killed(signal_name(returncode), returncode, stage, where, stderr_tail)
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
            f"f16, {' and '.join(PROBE_FILE_TYPES)} of a tiny Qwen3 quantized by libllama and "
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


def probe_detail(p: ProbeResult) -> str:
    if p.cached:
        when = f" on {p.checked_at}" if p.checked_at else ""
        return f"{p.detail} (result cached{when} for this llama.cpp build; {RECHECK_HINT})"
    return f"{p.detail} (ran in {p.seconds:.1f} s)"


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
            llama_cpp = libllama.bindings()
            llama_cpp.llama_backend_init()
        except Exception as exc:  # noqa: BLE001 - a broken install raises anything
            return finish({"ok": False, "kind": "missing", "error": one_line(exc)}, 5)

        current = "writing the f16 probe GGUF"
        stage(current)
        f16 = write_probe_gguf(workdir / "probe_f16.gguf")
        rows = 0.5 * np.random.default_rng(7).standard_normal((PROBE_ROWS, PROBE_DIMS["hidden"]))
        rows = rows.astype(np.float32)
        current = "decoding the f16 model"
        stage(current)
        base = _decode_rows(llama_cpp, f16, rows)
        cosine: dict[str, float] = {}
        for qtype in PROBE_FILE_TYPES:
            current = f"quantizing to {qtype} (libllama)"
            stage(current)
            out = workdir / f"probe_{qtype.lower()}.gguf"
            try:
                quantize(f16, out, qtype, engine=Engine.LIBRARY, threads=2)
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
        error = f"{type(exc).__name__}: {one_line(exc)}"
        return finish({"ok": False, "kind": "environment", "stage": current, "error": error}, 4)
    finally:
        os.close(fd)
