"""`convert`: a Qwen3 backbone → GGUF, natively or with llama.cpp's convert_hf_to_gguf.py.

INPUT is an extracted ``qwen3_backbone/`` folder, a whole extract output folder, or a MOSS-TTS
source checkpoint; from a source checkpoint the native engine reads the backbone straight from
the source shards (``language_model.*`` and ``lm_heads.0``), with no intermediate copy.

Both engines check the same things first (config, tokenizer, tensor names and shapes, the
output path), and both write to a temporary name renamed into place only when complete.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from ..disk.layout_names import BACKBONE_DIR
from ..disk.page_cache import SourcePages
from ..disk.staging import check_free_space, check_target, staged_file
from ..errors import OutputError, ToolError, UsageError
from ..gguf.write import (
    GGUFTensor,
    OutType,
    plan_backbone_tensors,
    write_gguf,
)
from ..native.llama_tools import (
    CONVERT_SCRIPT,
    GET_SCRIPT_HINT,
    find_llama_cpp,
    last_lines,
    run_streaming,
)
from ..progress import ProgressReporter, ensure
from ..source.backbone import Backbone, open_backbone, plan_native
from ..source.checkpoint import MossCheckpoint
from .extract import extract

log = logging.getLogger(__name__)

# what llama.cpp's converter needs besides the tree; pip names and the pinned torch
CONVERTER_PACKAGES = {"torch": "torch==2.13.0", "transformers": "transformers"}
_PIP_NAMES = {"sentencepiece": "sentencepiece", "google": "protobuf", "yaml": "pyyaml"}


class Converter(str, Enum):
    """Which converter writes the f16/bf16 GGUF (`convert --engine`); not a quantize engine."""

    NATIVE = "native"
    LLAMA_CPP = "llama.cpp"

    @classmethod
    def parse(cls, value: str | Converter) -> Converter:
        text = str(getattr(value, "value", value)).lower()
        aliases = {"llama_cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama-cpp": "llama.cpp"}
        try:
            return cls(aliases.get(text, text))
        except ValueError:
            raise UsageError(
                f"unknown engine {value!r}", hint="choose native or llama.cpp"
            ) from None


@dataclass
class ConvertResult:
    outfile: Path
    outtype: str
    engine: str
    source_kind: str
    n_tensors: int
    tensor_types: dict[str, int]
    bytes_written: int
    seconds: float
    notes: list[str] = field(default_factory=list)


def check_outfile(outfile: Path, force: bool) -> None:
    if outfile.is_dir():
        raise OutputError("is a folder", path=outfile, hint="give --outfile a file name")
    check_target(outfile, force, kind="file")
    probe = outfile.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(
            f"cannot create the output: {probe} is not a folder",
            path=outfile,
            hint="choose a writable location",
        )


def _type_counts(tensors: list[GGUFTensor]) -> dict[str, int]:
    return dict(Counter(t.qtype.name for t in tensors))


# --------------------------------------------------------------------------- convert


def convert(
    input: Path | MossCheckpoint,
    outfile: Path,
    outtype: str | OutType = "f16",
    engine: str | Converter = "native",
    llama_cpp: Path | str | None = None,
    force: bool = False,
    progress: ProgressReporter | None = None,
    source_pages: SourcePages | None = None,
) -> ConvertResult:
    """Convert INPUT's Qwen3 backbone to a GGUF at outfile.

    ``source_pages`` (native engine) is told of each source range as it is read.
    """
    started = time.perf_counter()
    out_type = OutType.parse(outtype)
    eng = Converter.parse(engine)
    outfile = Path(outfile)
    check_outfile(outfile, force)
    backbone = open_backbone(input)
    tensors = plan_backbone_tensors(backbone.params, backbone.tensors, out_type, backbone.root)
    if eng is Converter.NATIVE:
        plan = plan_native(backbone, out_type, tensors)
        with staged_file(outfile, force=force) as tmp:
            check_free_space(tmp.parent, plan.tensor_bytes + (64 << 20), outfile)
            size = write_gguf(tmp, plan, progress, source_pages)
        types = _type_counts(plan.tensors)
    else:
        size, types = _convert_llama_cpp(
            backbone, outfile, out_type, tensors, llama_cpp, force, progress
        )
    return ConvertResult(
        outfile=outfile,
        outtype=out_type.value,
        engine=eng.value,
        source_kind=backbone.kind,
        n_tensors=sum(types.values()),
        tensor_types=types,
        bytes_written=size,
        seconds=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------- llama.cpp engine


def locate_converter(llama_cpp: Path | str | None) -> tuple[Path, Path | None]:
    """(convert_hf_to_gguf.py, the tree's gguf-py or None) from DIR or $LLAMA_CPP_DIR."""
    tree = find_llama_cpp(llama_cpp)
    if tree is None or tree.root is None:
        raise ToolError(
            f"no llama.cpp tree with {CONVERT_SCRIPT} found (no --llama-cpp, no "
            "$LLAMA_CPP_DIR, and no llama-quantize on PATH inside a tree)",
            hint=GET_SCRIPT_HINT,
        )
    script = tree.convert_script
    if script is None:
        raise ToolError(f"{CONVERT_SCRIPT} not found", path=tree.root, hint=GET_SCRIPT_HINT)
    return script, tree.gguf_py


def build_convert_cmd(
    script: Path | str,
    model_dir: Path | str,
    outfile: Path | str,
    outtype: str,
    *,
    python: str | None = None,
) -> list[str]:
    """The convert_hf_to_gguf.py argv, as the guide's step 2 runs it."""
    return [
        python or sys.executable,
        str(script),
        str(model_dir),
        "--outfile",
        str(outfile),
        "--outtype",
        str(outtype),
    ]


def converter_env(gguf_py: Path | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the converter: the tree's own gguf-py first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env.pop("NO_LOCAL_GGUF", None)
    env["PYTHONUNBUFFERED"] = "1"
    if gguf_py is not None:
        rest = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = str(gguf_py) + (os.pathsep + rest if rest else "")
    return env


_TENSOR_LINE = re.compile(
    r"^INFO:hf-to-gguf:(?P<name>[\w.]+),\s+\S+\s+-->\s+(?P<type>\w+),\s+shape\s+=\s+\{"
)
_WRITING = re.compile(r"Writing:\s+(?P<pct>\d+)%")
_NO_MODULE = re.compile(r"No module named '(?P<mod>[\w.]+)'")


class ConverterLogParser:
    """Turns convert_hf_to_gguf.py output, fed in arbitrary pieces, into progress.

    It prints one ``INFO:hf-to-gguf:NAME, DTYPE --> TYPE, shape = {…}`` line per tensor while
    planning, then a tqdm ``Writing: NN%`` bar (carriage returns) while writing.
    """

    def __init__(self, progress: ProgressReporter, n_tensors: int, total_bytes: int):
        self.bar = progress
        self.total_bytes = total_bytes
        self.types: Counter[str] = Counter()
        self.names: list[str] = []
        self.missing_module: str | None = None
        self._pending = ""
        self._reported = 0
        progress.start("convert:tensors", "tensors", n_tensors, "")
        progress.start("convert:bytes", "convert (llama.cpp)", total_bytes, "B")

    def feed(self, text: str) -> None:
        self._pending += text
        *pieces, self._pending = re.split(r"[\r\n]", self._pending)
        for piece in pieces:
            self._line(piece)
        # a tqdm update arrives without its line end; read it at once
        if "Writing:" in self._pending:
            self._writing(self._pending)

    def close(self) -> None:
        if self._pending:
            self._line(self._pending)
            self._pending = ""
        self.bar.finish("convert:tensors")
        self.bar.finish("convert:bytes")

    def _line(self, line: str) -> None:
        if m := _TENSOR_LINE.match(line):
            self.names.append(m["name"])
            self.types[m["type"]] += 1
            self.bar.advance("convert:tensors", 1, description=m["name"])
        elif "Writing:" in line:
            self._writing(line)
        elif m := _NO_MODULE.search(line):
            self.missing_module = m["mod"].split(".")[0]

    def _writing(self, text: str) -> None:
        matches = _WRITING.findall(text)
        if not matches:
            return
        done = self.total_bytes * int(matches[-1]) // 100
        if done > self._reported:
            self.bar.advance("convert:bytes", done - self._reported)
            self._reported = done


def _check_converter_deps() -> None:
    for module, pip_name in CONVERTER_PACKAGES.items():
        if importlib.util.find_spec(module) is None:
            raise ToolError(
                f"llama.cpp's converter needs the Python package {module!r}, which is not "
                "installed",
                hint=f"pip install {pip_name}, or use --engine native (needs neither)",
            )


def run_converter(
    script: Path,
    gguf_py: Path | None,
    model_dir: Path,
    outfile: Path,
    outtype: OutType,
    n_tensors: int,
    total_bytes: int,
    progress: ProgressReporter | None = None,
) -> dict[str, int]:
    """Run convert_hf_to_gguf.py on model_dir; returns the tensor type counts it reported."""
    parser = ConverterLogParser(ensure(progress), n_tensors, total_bytes)
    cmd = build_convert_cmd(script, model_dir, outfile, outtype.value)
    result = run_streaming(cmd, parser.feed, env=converter_env(gguf_py), tail_lines=60)
    parser.close()
    if result.returncode != 0:
        if parser.missing_module:
            mod = parser.missing_module
            pip_name = CONVERTER_PACKAGES.get(mod) or _PIP_NAMES.get(mod, mod)
            raise ToolError(
                f"llama.cpp's converter needs the Python package {mod!r}, which is not installed",
                path=script,
                hint=f"pip install {pip_name}, or use --engine native",
            )
        raise ToolError(
            f"convert_hf_to_gguf.py failed (exit {result.returncode}): "
            f"{last_lines(result.tail, 4)}",
            path=script,
        )
    if not outfile.is_file() or outfile.stat().st_size == 0:
        raise ToolError(
            "convert_hf_to_gguf.py exited without writing the output",
            path=outfile,
            hint="run it by hand with --verbose to see why",
        )
    return dict(parser.types)


def _convert_llama_cpp(
    backbone: Backbone,
    outfile: Path,
    outtype: OutType,
    tensors: list[GGUFTensor],
    llama_cpp: Path | str | None,
    force: bool,
    progress: ProgressReporter | None,
) -> tuple[int, dict[str, int]]:
    script, gguf_py = locate_converter(llama_cpp)
    _check_converter_deps()
    total = sum(t.nbytes for t in tensors)
    with staged_file(outfile, force=force) as tmp:
        check_free_space(tmp.parent, total + (64 << 20), outfile)
        if backbone.kind == "moss":
            # the converter reads a Hugging Face folder: extract one beside the output
            with tempfile.TemporaryDirectory(
                dir=tmp.parent, prefix=f".{outfile.name}.extract-"
            ) as work:
                extracted = Path(work) / "extracted"
                extract(backbone.root, extracted, progress=progress)
                types = run_converter(
                    script, gguf_py, extracted / BACKBONE_DIR, tmp, outtype, len(tensors),
                    total, progress,
                )  # fmt: skip
        else:
            types = run_converter(
                script, gguf_py, backbone.root, tmp, outtype, len(tensors), total, progress
            )
        size = tmp.stat().st_size
    return size, types
