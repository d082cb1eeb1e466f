"""`convert ADAPTER --format lora --base MODEL`: a PEFT adapter → llama.cpp's adapter GGUF.

The plan is source/lora_gguf.py's, the format gguf/lora.py's; here the adapter and the base
are found (a folder, a Hub id, a builtin), the adapter's own word on its base is checked, and
the file is written under a temporary name and renamed (nothing half-written).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..disk.staging import staged_file
from ..errors import InputError, UsageError
from ..gguf.lora import OUTTYPES, BaseIdentity, write_lora_gguf
from ..progress import ProgressReporter
from ..source.checkpoint import open_checkpoint, resolve_model
from ..source.lora import AdapterSpec, base_mismatch, open_adapter
from ..source.lora_gguf import plan_adapter_gguf
from .convert import check_outfile
from .made_from import source_identity

FORMAT = "lora"
log = logging.getLogger(__name__)


@dataclass
class LoraConvertResult:
    outfile: Path
    outtype: str
    n_tensors: int
    alpha: float
    identity: BaseIdentity
    bytes_written: int
    seconds: float
    notes: list[str] = field(default_factory=list)


def model_name(model: str, model_dir: Path) -> str:
    """How the adapter file names its base: repo@commit, a builtin name, or "" (a folder)."""
    ident = source_identity(model, model_dir)
    if "repo" in ident:
        return f"{ident['repo']}@{ident['commit']}"
    return str(ident.get("model") or "")


def convert_lora(adapter: str, base: str | None, outfile: Path, outtype: str = "f32",
                 force: bool = False, progress: ProgressReporter | None = None,
                 force_base: bool = False) -> LoraConvertResult:  # fmt: skip
    """ADAPTER (a PEFT folder or Hub id) as an adapter GGUF at OUTFILE for BASE; FORCE_BASE
    converts one whose config names another base (warned, as `all --force-base` merges)."""
    started = time.perf_counter()
    if not base:
        raise UsageError("--format lora needs --base MODEL: the MOSS checkpoint the adapter "
                         "was trained on (a folder or Hub id)")  # fmt: skip
    outtype = outtype.strip().lower()
    if outtype not in OUTTYPES:
        raise UsageError(f"unknown --outtype {outtype!r} for --format lora",
                         hint="choose one of " + ", ".join(OUTTYPES))  # fmt: skip
    outfile = Path(outfile)
    check_outfile(outfile, force)
    opened = open_adapter(AdapterSpec(adapter), progress=progress)
    model_dir = resolve_model(base, progress=progress)
    ident = source_identity(base, model_dir)
    mismatch = base_mismatch(opened, ident)
    if mismatch and not force_base:
        raise InputError(f"{mismatch}: an adapter for another base",
                         path=opened.folder / "adapter_config.json",
                         hint="give the base it was trained on as --base, or pass "
                         "--force-base")  # fmt: skip
    if mismatch:
        # the file then names --base as its base: synth and serve check against that
        log.warning("converting %s although it %s (--force-base)", adapter, mismatch)
    ck = open_checkpoint(model_dir)
    plan = plan_adapter_gguf(ck, opened, model_name(base, model_dir))
    for note in plan.notes:
        log.debug("%s", note)
    with staged_file(outfile, force=force) as tmp:
        size = write_lora_gguf(tmp, plan.tensors, plan.alpha, outtype, plan.identity)
    return LoraConvertResult(outfile, outtype, len(plan.tensors), plan.alpha, plan.identity,
                             size, time.perf_counter() - started, plan.notes)  # fmt: skip
