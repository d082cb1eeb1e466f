"""`verify`: check a converted MOSS-TTS model and report every check as a row.

TARGET is a weights folder (made by `layout`/`all`), a synth config YAML (its paths are
checked, relative to the YAML's folder), an `extract` output folder, or a single GGUF
(target.py). Model facts (n_vq, sizes, token ids) come from ``extraction_meta.json``'s
``moss_config`` or from ``--source`` (model_facts.py).

A failing check is a row with status "fail", never an exception; exceptions are kept for
bad usage (a TARGET that does not exist or is not one of the four kinds, an unreadable
YAML, a --source that cannot be opened, --deep without torch).

The checks, by family, each a module: structure.py (the files, their names and shapes, the
manifest), values.py (one read of every file: hashes, Inf/NaN, equality with the source),
metadata.py (the GGUF header), tokenizer.py, source.py (tables against the GGUF, everything
against the source), deep.py (--deep: llama.cpp against a torch reference); quality.py holds
the limits, tensors.py the tensor reads and measures; context.py the state they share;
reference.py the torch forward --deep compares llama.cpp with; nano.py a MOSS-TTS-Nano
folder's own rows.

May import: nano/, tts/, quantize/, source/, gguf/, disk/, native/ and the top level (errors,
progress, report, hold_points) (rank 6); never doctor/ (beside it), pipeline/ or cli/.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..disk.digests import HashRecord
from ..errors import UsageError
from ..gguf.read import GgufFile, GgufFormatError, GgufTensorInfo, file_type_name, read_gguf
from ..progress import ProgressReporter, ensure
from ..report import FAIL, PASS, WARN, CheckRow
from .audio_codec import codec_part, verify_codec_file
from .context import Context
from .deep import (
    check_deep_deps,
    compare_deep,
    deep_checks,
    deep_prompt_ids,
    llama_hidden,
    reference_hidden,
)
from .first_class import is_first_class, verify_first_class
from .metadata import gguf_checks, parse_ggufs
from .model_facts import Facts, facts_from_config
from .quality import (
    DEEP_THRESHOLDS,
    TENSOR_MAX_REL_RMSE,
    QualitySummary,
    TensorQuality,
    bpw_range,
    deep_class,
    file_type_base,
    tensor_threshold,
)
from .result import GROUPS, DeepResult, VerifyReport
from .source import cross_checks, open_source, source_checks
from .structure import CODEC_ROW, file_rows
from .target import Target, find_target
from .tensors import compare_tensors, dequantize_rows, expected_gguf_tensors, moss_source_name
from .tokenizer import tokenizer_checks
from .values import SCALE_OFFSETS, file_pass, finite_blocks

__all__ = [
    "CODEC_ROW", "DEEP_THRESHOLDS", "FAIL", "GROUPS", "PASS", "SCALE_OFFSETS",
    "TENSOR_MAX_REL_RMSE", "WARN", "CheckRow", "DeepResult", "Facts", "GgufFile",
    "GgufFormatError", "GgufTensorInfo", "QualitySummary", "Target", "TensorQuality",
    "VerifyReport", "bpw_range", "compare_deep", "compare_tensors", "deep_class",
    "deep_prompt_ids", "dequantize_rows", "expected_gguf_tensors", "facts_from_config",
    "file_type_base", "file_type_name", "find_target", "finite_blocks", "llama_hidden",
    "moss_source_name", "read_gguf", "reference_hidden", "tensor_threshold", "verify",
]  # fmt: skip

log = logging.getLogger(__name__)


def _run(ctx: Context) -> None:
    """The checks in order: each step reads what the ones before it found."""
    steps = [open_source, file_rows, parse_ggufs, file_pass, gguf_checks, tokenizer_checks,
             cross_checks]  # fmt: skip
    steps += [source_checks] if ctx.source_arg is not None or ctx.deep else []
    steps += [deep_checks] if ctx.deep else []
    for step in steps:
        started = time.perf_counter()
        step(ctx)
        log.debug("verify %s: %.2f s", step.__name__, time.perf_counter() - started)


def verify(
    target: Path,
    *,
    source: str | None = None,
    deep: bool = False,
    progress: ProgressReporter | None = None,
    record: HashRecord | None = None,
) -> VerifyReport:
    """Check TARGET (weights folder, synth YAML, extract folder or GGUF); one row per check.

    ``source`` (a local folder, Hub id or builtin:tiny) adds the exact and numeric
    comparisons with the source checkpoint; ``deep`` runs the backbone in llama.cpp
    against a torch reference forward of the source; ``record`` is the run's hash record
    (`all`'s: files its writers hashed and checked are not read again). Failing checks are rows
    (``report.ok`` is False); bad usage raises UsageError / InputError.
    """
    started = time.perf_counter()
    if target is None or str(target).strip() == "":
        raise UsageError("no TARGET given", hint="moss-gguf verify WEIGHTS_FOLDER")
    if is_first_class(Path(target)):  # OpenMOSS's fork's format: its own rows
        return verify_first_class(Path(target), source, deep)
    if codec_part(Path(target)) is not None:  # the fork's codec GGUFs (docs/audio-codec.md)
        return verify_codec_file(Path(target), deep)
    if deep:
        check_deep_deps()
    t = find_target(Path(target))
    if deep and not t.ggufs:
        raise UsageError(
            f"--deep runs a GGUF in llama.cpp, and this {t.kind} target has none",
            path=t.path,
            hint="verify the weights folder or the GGUF",
        )
    ctx = Context(t, source, deep, ensure(progress), record=record)
    _run(ctx)
    return VerifyReport(
        target=t.path,
        kind=t.kind,
        rows=sorted(ctx.rows.rows, key=lambda r: GROUPS.index(r.group)),
        model=ctx.facts.summary() if ctx.facts else {},
        quality=ctx.quality,
        deep=ctx.deep_results,
        seconds=time.perf_counter() - started,
    )
