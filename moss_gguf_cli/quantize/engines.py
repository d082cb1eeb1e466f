"""The one engine vocabulary: every quantize engine name the CLI accepts, the one chooser, and
the protocol the quantizers implement.

- direct: quantizes straight from the checkpoint with ggml, every type in one read, no
  intermediate GGUF (quantize/direct.py; `all` only, its default where it can run).
- binary: llama.cpp's `llama-quantize` on an f16/bf16 GGUF (quantize/llama.py).
- library: the same `llama_model_quantize`, in-process through llama-cpp-python's libllama.
- auto: `all` takes direct where it runs, else binary, else library; `quantize` (a GGUF in)
  takes binary, else library.

`all --engine`, `quantize --engine`, doctor and its pre-flight all ask `parse_engine`,
`choose_engine` and `checked_as` here instead of deciding for themselves.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import ToolError, UsageError
from ..native import libggml
from ..native import llama_tools as lc

if TYPE_CHECKING:
    from ..disk.digests import HashRecord
    from ..disk.page_cache import SourcePages
    from ..progress import ProgressReporter
    from ..source.checkpoint import MossCheckpoint

log = logging.getLogger(__name__)


class Engine(str, Enum):
    AUTO = "auto"
    DIRECT = "direct"
    BINARY = "binary"
    LIBRARY = "library"


NAMES = tuple(e.value for e in Engine)
# a GGUF in (`quantize`): the direct engine reads a checkpoint, not a GGUF
GGUF_ENGINES = (Engine.AUTO, Engine.BINARY, Engine.LIBRARY)


def parse_engine(value: Engine | str, accepted: Sequence[Engine] = tuple(Engine)) -> Engine:
    """The engine a name means (any case); a UsageError naming the choices for any other."""
    text = value.value if isinstance(value, Engine) else str(value).lower()
    choices = ", ".join(e.value for e in accepted)
    try:
        engine = Engine(text)
    except ValueError:
        raise UsageError(f"unknown engine {value!r}", hint=f"choose {choices}") from None
    if engine not in accepted:
        raise UsageError(
            f"the {engine.value} engine cannot quantize a GGUF: it reads the checkpoint "
            "(moss-gguf all)",
            hint=f"choose {choices}",
        )
    return engine


def direct_unavailable() -> str | None:
    """None if the direct engine can run here, else why not (it runs libllama's dry run and
    libggml's quantizer)."""
    if not lc.library_available():
        return "llama-cpp-python (libllama) is not installed"
    try:
        libggml.load()
    except libggml.GgmlUnavailable as exc:
        return str(exc)
    return None


def resolve_engine(engine: Engine, llama_cpp: Path | None) -> tuple[Engine, Path | None]:
    """The llama.cpp engine that quantizes a GGUF for ENGINE (auto: binary, else library), and
    the llama-quantize binary when it is binary."""
    if engine is Engine.LIBRARY:
        if not lc.library_available():
            raise ToolError(
                "llama-cpp-python (libllama) is not installed",
                hint=f"{lc.LIBRARY_HINT}; or use --engine binary",
            )
        return Engine.LIBRARY, None
    tree = lc.find_llama_cpp(llama_cpp)
    exe = tree.quantize_bin if tree else None
    if engine is Engine.BINARY:
        if exe is None:
            where = f" in {tree.root}" if tree and tree.root else ""
            raise ToolError(
                f"{lc.QUANTIZE_BIN} not found{where}",
                hint=f"{lc.GET_SCRIPT_HINT}; or use --engine library",
            )
        return Engine.BINARY, exe
    if exe is not None:
        return Engine.BINARY, exe
    if lc.library_available():
        if tree is not None:
            log.warning(
                "no %s built in %s (%s); using llama-cpp-python's libllama instead",
                lc.QUANTIZE_BIN, tree.root, tree.source,
            )  # fmt: skip
        return Engine.LIBRARY, None
    raise ToolError(
        "no quantize engine: llama-quantize not found and llama-cpp-python not installed",
        hint=f"{lc.GET_SCRIPT_HINT}; or {lc.LIBRARY_HINT}",
    )


@dataclass(frozen=True)
class Choice:
    """The engine that runs (never auto) and, for binary, its llama-quantize."""

    engine: Engine
    binary: Path | None = None

    @property
    def from_checkpoint(self) -> bool:
        """True: quantizes straight from the checkpoint, so no intermediate GGUF is made."""
        return self.engine is Engine.DIRECT


def choose_engine(engine: Engine | str, llama_cpp: Path | None, *, checkpoint: bool) -> Choice:
    """The one chooser. CHECKPOINT: the input is a checkpoint (`all`: direct where it can
    run); else a GGUF (`quantize`: binary or library)."""
    wanted = parse_engine(engine, tuple(Engine) if checkpoint else GGUF_ENGINES)
    if checkpoint and wanted in (Engine.AUTO, Engine.DIRECT):
        why = direct_unavailable()
        if why is None:
            return Choice(Engine.DIRECT)
        if wanted is Engine.DIRECT:
            raise ToolError(f"the direct engine cannot run: {why}", hint=lc.LIBRARY_HINT)
    resolved, exe = resolve_engine(wanted, llama_cpp)
    return Choice(resolved, exe)


def checked_as(engine: Engine | str, *, checkpoint: bool) -> Engine:
    """The engine whose needs doctor's pre-flight checks for ENGINE (CHECKPOINT as in
    `choose_engine`): the direct engine needs what the library engine needs (libllama runs
    here); where it cannot run, `all` falls back as auto does."""
    wanted = parse_engine(engine, tuple(Engine) if checkpoint else GGUF_ENGINES)
    if not checkpoint:
        return wanted
    if wanted in (Engine.AUTO, Engine.DIRECT) and direct_unavailable() is None:
        return Engine.LIBRARY
    return Engine.AUTO if wanted is Engine.DIRECT else wanted


# --------------------------------------------------------------------------- the protocol


@dataclass
class Companion:
    """The first-class GGUFs written by the same read as the backbone's (`all --format
    backend --format moss-tts-delay`): only the direct engine takes them."""

    outputs: list[tuple[Path, str]]  # (output GGUF, canonical file type)
    keep: Path | None = None  # the folder of its f16/bf16 file, when that is asked for too
    audio_tables: str | None = None  # --audio-tables-type


@dataclass
class QuantizeRequest:
    """What `all`'s quantize step asks for: each output and its type, from the opened
    checkpoint (direct) or from the intermediate GGUF (binary, library)."""

    outputs: list[tuple[Path, str]]  # (output GGUF, canonical file type)
    checkpoint: MossCheckpoint
    intermediate: Path | None  # the f16/bf16 GGUF the two-pass engines read
    outtype: str  # the intermediate's type (auto, f16, bf16)
    work: Path  # where the direct engine keeps its stand-in and kept intermediate
    imatrix: Path | None = None
    threads: int | None = None
    keep_intermediate: bool = False
    pages: SourcePages | None = None
    record: HashRecord | None = None  # the run's: what the engine hashed and checked
    also: Companion | None = None  # more outputs from the same read (direct engine only)


@dataclass
class QuantizeResult:
    """One output GGUF as an engine made it."""

    input: Path
    output: Path
    file_type: str
    engine: str
    command: list[str]
    input_bytes: int
    output_bytes: int
    n_elements: int
    input_bpw: float  # bits per weight of the input tensor data
    bpw: float  # bits per weight of the output tensor data
    seconds: float
    tensors: list[lc.TensorRow]
    fallbacks: list[lc.TensorFallback]
    llama_cpp: str | None  # which llama.cpp did it
    log_tail: list[str] = field(default_factory=list)

    @property
    def type_counts(self) -> Counter:
        return Counter(row.dst_type for row in self.tensors)


@dataclass
class Quantized:
    results: list[QuantizeResult]
    intermediate: Path | None  # the f16/bf16 GGUF there is now, if any
    notes: list[str] = field(default_factory=list)


class Quantizer(Protocol):
    """One quantize engine as `all` runs it."""

    choice: Choice

    def quantize(
        self, request: QuantizeRequest, force: bool, progress: ProgressReporter
    ) -> Quantized:
        """Write every requested output; what was made."""
        ...
