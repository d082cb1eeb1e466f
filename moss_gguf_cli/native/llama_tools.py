"""Find llama.cpp (source tree, binaries on PATH, libllama), run its tools, read their output.

Three ways to reach llama.cpp:

- a source/build tree: an explicit folder, else ``$LLAMA_CPP_DIR`` (``convert_hf_to_gguf.py``,
  ``gguf-py/``, ``build/bin/llama-quantize``); ``scripts/get-llama-cpp.sh`` makes one;
- ``llama-quantize`` on ``PATH``;
- libllama bundled with llama-cpp-python (``import llama_cpp``), used in-process.

The parser at the end turns llama-quantize's per-tensor log (the same text libllama sends
through ``llama_log_set``) into events and rows.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ToolError
from . import libllama
from .cpu_features import REINSTALL_HINT

log = logging.getLogger(__name__)

QUANTIZE_BIN = "llama-quantize"
CONVERT_SCRIPT = "convert_hf_to_gguf.py"
PIN_FILE = ".moss-gguf-pin"  # written by scripts/get-llama-cpp.sh
GET_SCRIPT_HINT = (
    "run scripts/get-llama-cpp.sh and export LLAMA_CPP_DIR=<the path it prints>, "
    "or pass --llama-cpp DIR"
)
LIBRARY_HINT = REINSTALL_HINT

# Where a build puts the binary, relative to the tree (cmake single/multi-config, old make).
_BIN_CANDIDATES = ("build/bin", "build/bin/Release", "bin", ".")


# --------------------------------------------------------------------------- locating


@dataclass(frozen=True)
class LlamaCppTree:
    """What was found: a tree (may be None for a bare binary on PATH) and its parts."""

    root: Path | None
    quantize_bin: Path | None
    source: str  # "argument", "LLAMA_CPP_DIR" or "PATH"

    @property
    def convert_script(self) -> Path | None:
        p = self.root / CONVERT_SCRIPT if self.root else None
        return p if p and p.is_file() else None

    @property
    def gguf_py(self) -> Path | None:
        p = self.root / "gguf-py" if self.root else None
        return p if p and (p / "gguf").is_dir() else None


def _exe_in(folder: Path) -> Path | None:
    for sub in _BIN_CANDIDATES:
        for name in (QUANTIZE_BIN, QUANTIZE_BIN + ".exe"):
            p = folder / sub / name
            if p.is_file() and os.access(p, os.X_OK):
                return p
    return None


def _tree_of_binary(exe: Path) -> Path | None:
    """The source tree a binary was built in (…/build/bin/llama-quantize), if it is there."""
    for parent in list(exe.resolve().parents)[:4]:
        if (parent / CONVERT_SCRIPT).is_file():
            return parent
    return None


def _tree_from_dir(folder: Path, source: str) -> LlamaCppTree:
    folder = folder.expanduser()
    if not folder.is_dir():
        raise ToolError(
            "llama.cpp folder not found", path=folder, hint=f"{source} must name a folder"
        )
    exe = _exe_in(folder)
    root = folder if (folder / CONVERT_SCRIPT).is_file() else None
    if root is None and exe is not None:
        root = _tree_of_binary(exe)
    if root is None and exe is None:
        raise ToolError(
            f"neither {CONVERT_SCRIPT} nor {QUANTIZE_BIN} found in this llama.cpp folder",
            path=folder,
            hint=GET_SCRIPT_HINT,
        )
    return LlamaCppTree(root=root, quantize_bin=exe, source=source)


def find_llama_cpp(llama_cpp: Path | str | None = None) -> LlamaCppTree | None:
    """An explicit folder, else $LLAMA_CPP_DIR, else llama-quantize on PATH; None if nothing.

    An explicit folder or $LLAMA_CPP_DIR that does not exist is an error, not a silent skip.
    """
    if llama_cpp is not None:
        return _tree_from_dir(Path(llama_cpp), "--llama-cpp")
    env = os.environ.get("LLAMA_CPP_DIR")
    if env:
        return _tree_from_dir(Path(env), "LLAMA_CPP_DIR")
    found = shutil.which(QUANTIZE_BIN)
    if found:
        exe = Path(found)
        return LlamaCppTree(root=_tree_of_binary(exe), quantize_bin=exe, source="PATH")
    return None


def find_quantize_binary(llama_cpp: Path | str | None = None) -> Path | None:
    tree = find_llama_cpp(llama_cpp)
    if tree is not None and tree.quantize_bin is None and llama_cpp is not None:
        raise ToolError(
            f"{QUANTIZE_BIN} is not built in this llama.cpp tree",
            path=tree.root,
            hint="cmake --build build --target llama-quantize, or run scripts/get-llama-cpp.sh",
        )
    return tree.quantize_bin if tree else None


# --------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class LlamaCppVersion:
    """Which llama.cpp something is; commits compare by prefix (short vs full hashes)."""

    origin: str  # "tree /path", "llama-cpp-python 0.3.36", "binary /path"
    commit: str | None = None
    build_number: int | None = None
    llama_version: str | None = None
    ggml_version: str | None = None

    def same_commit(self, other: LlamaCppVersion) -> bool | None:
        """True/False when both commits are known, None when either is not."""
        a, b = _clean_commit(self.commit), _clean_commit(other.commit)
        if not a or not b:
            return None
        n = min(len(a), len(b))
        return a[:n] == b[:n]

    def describe(self) -> str:
        parts = [self.origin]
        if self.commit:
            parts.append(f"commit {self.commit}")
        if self.llama_version:
            parts.append(f"llama {self.llama_version}")
        if self.ggml_version:
            parts.append(f"ggml {self.ggml_version}")
        return ", ".join(parts)


def _clean_commit(commit: str | None) -> str | None:
    if not commit:
        return None
    c = commit.strip().lower().removesuffix("-dirty")
    return c if re.fullmatch(r"[0-9a-f]{7,40}", c) else None


def _cmake_version(cmakelists: Path, prefix: str) -> str | None:
    try:
        text = cmakelists.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"set\({prefix}_VERSION_{part}\s+(\d+)\)", text)
        if not m:
            return None
        parts.append(m.group(1))
    return ".".join(parts)


def tree_version(root: Path) -> LlamaCppVersion:
    """Version of a source tree: the pin file of get-llama-cpp.sh, else its own git HEAD."""
    commit: str | None = None
    pin = root / PIN_FILE
    if pin.is_file():
        for line in pin.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "llama_cpp_commit" and value.strip() != "unknown":
                commit = value.strip()
    if commit is None and (root / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            if out.returncode == 0:
                commit = out.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return LlamaCppVersion(
        origin=f"tree {root}",
        commit=commit,
        llama_version=_cmake_version(root / "CMakeLists.txt", "LLAMA"),
        ggml_version=_cmake_version(root / "ggml" / "CMakeLists.txt", "GGML"),
    )


def library_available() -> bool:
    try:
        libllama.bindings()
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def library_version() -> LlamaCppVersion | None:
    """llama.cpp inside llama-cpp-python: ggml's recorded commit and the library versions."""
    import ctypes

    try:
        llama_cpp = libllama.bindings()
        lib = libllama.handle()
    except Exception:  # noqa: BLE001
        return None

    def call(name: str) -> str | None:
        # dlsym on libllama's handle also searches the ggml libraries it links
        try:
            fn = getattr(lib, name)
        except AttributeError:
            return None
        fn.restype = ctypes.c_char_p
        fn.argtypes = []
        value = fn()
        return value.decode("utf-8", "replace") if value else None

    return LlamaCppVersion(
        origin=f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}",
        commit=call("ggml_commit"),
        llama_version=call("llama_version"),
        ggml_version=call("ggml_version"),
    )


# --------------------------------------------------------------------------- commands


def build_quantize_cmd(
    exe: Path | str,
    input: Path | str,
    output: Path | str,
    file_type: str,
    *,
    threads: int | None = None,
    imatrix: Path | str | None = None,
    token_embedding_type: str | None = None,
    output_tensor_type: str | None = None,
    allow_requantize: bool = False,
    pure: bool = False,
) -> list[str]:
    """The llama-quantize argv: options first, then INPUT OUTPUT TYPE [THREADS]."""
    cmd = [str(exe)]
    if allow_requantize:
        cmd.append("--allow-requantize")
    if pure:
        cmd.append("--pure")
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    if token_embedding_type is not None:
        cmd += ["--token-embedding-type", token_embedding_type]
    if output_tensor_type is not None:
        cmd += ["--output-tensor-type", output_tensor_type]
    cmd += [str(input), str(output), file_type]
    if threads is not None:
        cmd.append(str(int(threads)))
    return cmd


@dataclass
class RunResult:
    returncode: int
    tail: list[str]  # last lines of combined stdout+stderr


def run_streaming(
    cmd: Sequence[str],
    on_text: Callable[[str], None] | None = None,
    *,
    tail_lines: int = 40,
    env: dict[str, str] | None = None,
) -> RunResult:
    """Run cmd, passing stdout+stderr text to on_text as it arrives (partial lines included).

    Partial lines matter: llama-quantize writes a tensor's name before the slow work on it.
    On any exception (Ctrl-C included) the child is stopped before the exception propagates.
    """
    log.debug("running: %s", " ".join(cmd))
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except OSError as exc:
        raise ToolError(f"cannot start {cmd[0]}: {exc.strerror or exc}", path=cmd[0]) from exc
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tail: deque[str] = deque(maxlen=tail_lines)
    partial = ""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text = decoder.decode(chunk)
            if on_text is not None and text:
                on_text(text)
            partial += text
            *lines, partial = partial.split("\n")
            tail.extend(lines)
        rest = decoder.decode(b"", final=True)
        if rest and on_text is not None:
            on_text(rest)
        partial += rest
        if partial:
            tail.append(partial)
        returncode = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    finally:
        proc.stdout.close()
    return RunResult(returncode=returncode, tail=list(tail))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def last_lines(lines: Sequence[str], n: int = 6) -> str:
    """The last n non-empty lines, joined for a one-line error message."""
    kept = [" ".join(x.split()) for x in lines if x.strip()]
    return " | ".join(kept[-n:]) if kept else "(no output)"


# --------------------------------------------------------------------------- log parser


@dataclass
class TensorRow:
    """One tensor of a quantize run, from its `[ i/ n] name - [shape], type = …` line."""

    index: int
    total: int
    name: str
    shape: tuple[int, ...]
    src_type: str
    dst_type: str
    src_mib: float
    dst_mib: float
    converted: bool  # False: copied unchanged
    notes: list[str] = field(default_factory=list)


@dataclass
class TensorFallback:
    """A tensor whose row length does not fit the wanted type's blocks."""

    name: str
    ncols: int
    block_size: int
    wanted_type: str
    used_type: str
    unusual_shape: bool  # even the fallback did not fit: F16 was used


@dataclass
class TypeOverride:
    name: str
    from_type: str
    to_type: str


@dataclass
class TensorStarted:
    index: int
    total: int
    name: str
    src_type: str


@dataclass
class TensorConverting:
    index: int
    total: int
    name: str
    src_type: str
    dst_type: str


@dataclass
class TensorDone:
    row: TensorRow


_PREFIX = re.compile(
    r"^\[\s*(?P<i>\d+)\s*/\s*(?P<n>\d+)\]\s+(?P<name>\S+)\s+-\s+"
    r"\[(?P<shape>[\d,\s]*)\],\s*type\s*=\s*(?P<src>\S+),\s?"
)
_CONVERTING = re.compile(r"converting to (?P<dst>\S+) \.\.\s*")
_SIZE_CONVERT = re.compile(
    r"size\s*=\s*(?P<a>[\d.]+) MiB\s*->\s*(?P<b>[\d.]+) MiB(?:\s*\((?P<dst>\S+)\))?\s*$"
)
_SIZE_COPY = re.compile(r"size\s*=\s*(?P<a>[\d.]+) MiB\s*$")
_FALLBACK = re.compile(
    r"warning:\s+(?P<name>\S+)\s+-\s+ncols\s+(?P<ncols>\d+)\s+not divisible by\s+"
    r"(?P<blk>\d+)\s+\(required for type\s+(?P<want>\S+)\)\s*"
    r"(?P<f16>\(WARNING: must use F16 due to unusual shape\)\s*)?"
    r"->\s*falling back to\s+(?P<used>\S+)"
)
_OVERRIDE = re.compile(
    r"(?P<name>\S+)\s+-\s+applying manual override:\s+(?P<a>\S+)\s+->\s+(?P<b>\S+)\s*$"
)
_MODEL_SIZE = re.compile(r"model size\s*=\s*(?P<mib>[\d.]+) MiB\s*\((?P<bpw>[\d.]+) BPW\)")
_QUANT_SIZE = re.compile(r"quant size\s*=\s*(?P<mib>[\d.]+) MiB\s*\((?P<bpw>[\d.]+) BPW\)")
_N_FALLBACK = re.compile(r"(?P<k>\d+) of (?P<n>\d+) tensor\(s\) required fallback quantization")
_FAILED = re.compile(r"failed to quantize: (?P<why>.*)$")
_BUILD = re.compile(r"version:\s*(?P<ver>\S+)\s*\(build (?P<num>-?\d+), commit (?P<commit>[^)]+)\)")
_QUANTIZE_TIME = re.compile(r"quantize time\s*=\s*(?P<ms>[\d.]+) ms")


class QuantizeLogParser:
    """Reads llama-quantize / llama_model_quantize log text, fed in arbitrary pieces.

    ``feed`` returns events as soon as they can be known: TensorStarted when a tensor's
    `[ i/ n] name … type = X, ` prefix appears (before the slow work), TensorConverting
    on `converting to Y .. `, TensorDone when its line ends. The collected rows, fallbacks
    and summary values stay on the parser.
    """

    def __init__(self) -> None:
        self.rows: list[TensorRow] = []
        self.fallbacks: list[TensorFallback] = []
        self.overrides: list[TypeOverride] = []
        self.total: int | None = None
        self.model_mib: float | None = None
        self.model_bpw: float | None = None
        self.quant_mib: float | None = None
        self.quant_bpw: float | None = None
        self.n_fallback: int | None = None
        self.error: str | None = None
        self.build: LlamaCppVersion | None = None
        self.quantize_ms: float | None = None
        self.lines: deque[str] = deque(maxlen=200)
        self._buf = ""
        self._pending: dict | None = None  # a tensor whose line was broken by a notice
        self._partial_state: tuple[int, bool] | None = None  # (index, converting seen)

    # -- feeding

    def feed(self, text: str) -> list[object]:
        events: list[object] = []
        self._buf += text.replace("\r\n", "\n")
        while True:
            nl = self._buf.find("\n")
            if nl < 0:
                break
            line, self._buf = self._buf[:nl], self._buf[nl + 1 :]
            events += self._partial(line)
            events += self._line(line)
        events += self._partial(self._buf)
        return events

    def close(self) -> list[object]:
        events: list[object] = []
        if self._buf:
            line, self._buf = self._buf, ""
            events += self._partial(line)
            events += self._line(line)
        return events

    # -- early events from an unfinished line

    def _partial(self, text: str) -> list[object]:
        events: list[object] = []
        m = _PREFIX.match(text)
        if m:
            i, n = int(m["i"]), int(m["n"])
            if self._partial_state is None or self._partial_state[0] != i:
                self._partial_state = (i, False)
                events.append(TensorStarted(i, n, m["name"], m["src"]))
            rest = text[m.end() :]
        elif self._pending is not None:
            i, n = self._pending["index"], self._pending["total"]
            rest = text
        else:
            return events
        c = _CONVERTING.search(rest)
        if c and self._partial_state is not None and not self._partial_state[1]:
            self._partial_state = (i, True)
            name = m["name"] if m else self._pending["name"]
            src = m["src"] if m else self._pending["src_type"]
            events.append(TensorConverting(i, n, name, src, c["dst"]))
        return events

    # -- complete lines

    def _line(self, line: str) -> list[object]:
        self.lines.append(line)
        s = line.strip()
        if not s:
            return []
        m = _PREFIX.match(s)
        if m:
            self.total = int(m["n"])
            self._pending = {
                "index": int(m["i"]),
                "total": int(m["n"]),
                "name": m["name"],
                "shape": tuple(int(x) for x in m["shape"].replace(",", " ").split()),
                "src_type": m["src"],
                "notes": [],
            }
            return self._finish_tensor(s[m.end() :])
        if self._pending is not None and (s.startswith("converting to") or s.startswith("size")):
            return self._finish_tensor(s)
        if self._pending is not None and s.startswith("======"):
            self._pending["notes"].append(s.strip("= ").strip())
            return []
        self._summary(s)
        return []

    def _finish_tensor(self, rest: str) -> list[object]:
        p = self._pending
        assert p is not None
        c = _CONVERTING.search(rest)
        if c:
            p["dst_type"] = c["dst"]
            rest = rest[c.end() :]
        sc = _SIZE_CONVERT.search(rest)
        sp = _SIZE_COPY.search(rest) if not sc else None
        if not sc and not sp:
            return []  # a line broken by a notice; the rest follows on a later line
        self._pending = None
        self._partial_state = None
        if sc:
            dst = p.get("dst_type") or sc["dst"] or p["src_type"]
            row = TensorRow(
                p["index"], p["total"], p["name"], p["shape"], p["src_type"], dst,
                float(sc["a"]), float(sc["b"]), True, p["notes"],
            )  # fmt: skip
        else:
            size = float(sp["a"])
            row = TensorRow(
                p["index"], p["total"], p["name"], p["shape"], p["src_type"], p["src_type"],
                size, size, False, p["notes"],
            )  # fmt: skip
        self.rows.append(row)
        return [TensorDone(row)]

    def _summary(self, s: str) -> None:
        if m := _FALLBACK.search(s):
            self.fallbacks.append(
                TensorFallback(
                    m["name"], int(m["ncols"]), int(m["blk"]), m["want"], m["used"], bool(m["f16"])
                )
            )
        elif m := _OVERRIDE.search(s):
            self.overrides.append(TypeOverride(m["name"], m["a"], m["b"]))
        elif m := _MODEL_SIZE.search(s):
            self.model_mib, self.model_bpw = float(m["mib"]), float(m["bpw"])
        elif m := _QUANT_SIZE.search(s):
            self.quant_mib, self.quant_bpw = float(m["mib"]), float(m["bpw"])
        elif m := _N_FALLBACK.search(s):
            self.n_fallback = int(m["k"])
        elif m := _FAILED.search(s):
            self.error = m["why"].strip()
        elif m := _BUILD.search(s):
            self.build = LlamaCppVersion(
                origin="llama-quantize",
                commit=m["commit"].strip(),
                build_number=int(m["num"]),
                llama_version=m["ver"],
            )
        elif m := _QUANTIZE_TIME.search(s):
            self.quantize_ms = float(m["ms"])


def parse_quantize_log(text: str) -> QuantizeLogParser:
    """Parse a whole log at once (tests, saved logs)."""
    parser = QuantizeLogParser()
    parser.feed(text)
    parser.close()
    return parser
