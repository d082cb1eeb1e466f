"""Disk plans and the pre-flight: the doctor's fast checks before long work (`all`, `quantize`,
`synth`), and the disk rows `doctor` shows."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..disk.staging import human_bytes
from ..errors import OutputError, ToolError
from ..native import llama_tools as lc
from ..quantize.engines import Engine, checked_as, direct_unavailable
from ..quantize.llama import APPROX_BPW
from ..report import FAIL, PASS, WARN, CheckRow
from .engines import resolve_engine
from .environment import REAL_MODEL_REPO, model_cached
from .runtime import RECHECK_HINT, runtime_probe

log = logging.getLogger(__name__)


# docs/ARCHITECTURE.md §1: the real MOSS-TTS (8B); the disk plan is computed from these dims.
REAL_MODEL = {
    "repo_id": REAL_MODEL_REPO,
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
    intermediate: int  # f16 GGUF in the work folder (0: the direct engine writes none)
    quantized: dict[str, int]  # per file type
    tables: int  # f16 .npy embeddings and heads
    margin: int = 64 << 20

    @property
    def output(self) -> int:
        """Peak bytes beside --output (the work folder holds any intermediate until quantize
        is done)."""
        return self.tables + self.intermediate + sum(self.quantized.values()) + self.margin

    def describe(self) -> str:
        file_types = " + ".join(f"{q} {human_bytes(b)}" for q, b in self.quantized.items())
        between = (
            f"f16 GGUF {human_bytes(self.intermediate)} + " if self.intermediate
            else "no f16 GGUF (the direct engine) + "
        )  # fmt: skip
        return f"tables {human_bytes(self.tables)} + {between}{file_types}"


def model_plan(
    dims: dict[str, Any], file_types: tuple[str, ...] = ("Q4_K_M",), direct: bool = False
) -> DiskPlan:
    """Bytes of each part `all` writes for a MOSS model of these dims (see REAL_MODEL);
    direct: quantized straight from the checkpoint, with no f16 GGUF between."""
    h, f, d = dims["hidden"], dims["intermediate"], dims["head_dim"]
    q, kv = dims["heads"] * d, dims["kv_heads"] * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h + 2 * d
    text = dims["vocab"] * h  # embed_tokens, and the text head of the same shape
    backbone = 2 * text + dims["layers"] * per_layer + h
    audio = 2 * dims["n_vq"] * dims["audio_rows"] * h  # emb_ext.* and lm_heads.1..n_vq
    return DiskPlan(
        backbone_params=backbone,
        source=2 * (backbone + audio),
        intermediate=0 if direct else 2 * backbone,
        quantized={t: int(backbone * APPROX_BPW.get(t.upper(), 16) / 8) for t in file_types},
        tables=2 * (2 * text + audio),
    )


def real_model_plan(
    file_types: tuple[str, ...] = ("Q4_K_M",), direct: bool | None = None
) -> DiskPlan:
    """What `all --model OpenMOSS-Team/MOSS-TTS` needs, from the dims of docs/ARCHITECTURE.md §1;
    direct None: with the engine `all` would pick here (direct where it runs)."""
    if direct is None:
        direct = direct_unavailable() is None
    return model_plan(REAL_MODEL, file_types, direct)


def _existing(path: Path) -> Path:
    probe = Path(path).expanduser().absolute()
    while not probe.exists():
        probe = probe.parent
    return probe


def disk_check(output: Path, needed: int, what: str, breakdown: str = "") -> CheckRow:
    """Free space (and writability) where output will be, against the needed bytes."""
    where = _existing(output)
    free = shutil.disk_usage(where).free
    if not os.access(where, os.W_OK):
        return CheckRow(
            "disk", "output disk", FAIL, f"{where} is not writable", "choose a writable --output"
        )
    parts = f" ({breakdown})" if breakdown else ""
    if free < needed:
        return CheckRow(
            "disk",
            "output disk",
            FAIL,
            f"{what} needs {human_bytes(needed)} of free disk, only {human_bytes(free)} "
            f"available at {where}{parts}",
            "free some disk or choose an --output on a larger disk",
        )
    return CheckRow(
        "disk",
        "output disk",
        PASS,
        f"{human_bytes(free)} free at {where}; {what} needs {human_bytes(needed)}{parts}",
    )


def disk_rows(output: Path) -> list[CheckRow]:
    from huggingface_hub import constants

    plan = real_model_plan()
    repo = REAL_MODEL["repo_id"]
    breakdown = (
        f"{plan.describe()}; from the dims of its {plan.backbone_params / 1e9:.1f} B backbone "
        "parameters, default --quant Q4_K_M; the source goes to the Hub cache"
    )
    out_row = disk_check(output, plan.output, f"`all --model {repo}`", breakdown)
    hub = Path(constants.HF_HUB_CACHE)
    cached = model_cached(hub, repo)
    hub_where = _existing(hub)
    hub_free = shutil.disk_usage(hub_where).free
    same_disk = hub_where.stat().st_dev == _existing(output).stat().st_dev
    left = hub_free - (plan.output if same_disk else 0)
    offline = " (offline mode)" if constants.HF_HUB_OFFLINE else ""
    detail = f"{hub}{offline}, {human_bytes(hub_free)} free"
    if cached:
        row = CheckRow("disk", "Hub cache", PASS, f"{detail}; {repo} is already there")
    elif left < plan.source:
        shared = " after the output's share (same disk)" if same_disk else ""
        row = CheckRow(
            "disk",
            "Hub cache",
            WARN,
            f"{detail}; downloading {repo} needs {human_bytes(plan.source)}{shared}",
            "free some disk, set HF_HUB_CACHE to a larger disk, or pass --model a local folder",
        )
    else:
        row = CheckRow(
            "disk",
            "Hub cache",
            PASS,
            f"{detail}; room for the {human_bytes(plan.source)} download of {repo}",
        )
    return [out_row, row]


def preflight(
    *,
    needs_quantize: bool,
    output: Path | None,
    needed_bytes: int | None,
    llama_cpp: Path | None,
    engine: Engine | str,
    needs_runtime: bool = False,
    from_checkpoint: bool = False,
) -> None:
    """The doctor's fast checks before long work; raises with the doctor's one-line fix.

    - needs_quantize: a quantize engine must exist (quantize's own resolution: ENGINE,
      --llama-cpp, $LLAMA_CPP_DIR, PATH); when it is libllama, the runtime probe must pass.
      from_checkpoint: ENGINE is `all`'s (the direct engine is checked as libllama).
    - needs_runtime: libllama must run here (synth; `all`, whose output is for synth).
    - output + needed_bytes: the disk of output's folder (where `all` also keeps its work
      folder) must hold needed_bytes; checked when both are given.

    The probe runs once per installed llama.cpp build (cached); a passing build costs a
    file read. Nothing is written besides that cache.
    """
    eng = checked_as(engine, checkpoint=from_checkpoint)
    probe_needed = needs_runtime
    if needs_quantize:
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
        resolve_engine(eng.value, llama_cpp)
    if output is not None and needed_bytes:
        row = disk_check(Path(output).parent, int(needed_bytes), "this run")
        if row.status == FAIL:
            raise OutputError(row.detail, path=output, hint=row.fix)


def quantize_bytes(n_elements: int, file_types: list[str]) -> int:
    """Rough output bytes of quantizing n_elements weights to each type (for pre-flight)."""
    margin = 16 << 20  # header and vocabulary: ~7 MB for the real 155k-token one
    return int(sum(n_elements * APPROX_BPW.get(t.upper(), 16) / 8 for t in file_types)) + margin
