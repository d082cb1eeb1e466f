"""`doctor`: can this machine do the job? Named checks, each pass / warn / fail with a fix.

The checks cost seconds, so they run before work that costs minutes: ``moss-gguf doctor``
shows them all, and :func:`preflight` runs the ones that decide whether `all`, `quantize`
or `synth` can finish (an engine, the llama.cpp runtime, the output disk).

The llama.cpp runtime is checked by *running* it, in a child process (runtime.py); what is
installed is environment.py; the rows that join the two are engines.py; disk plans and the
pre-flight are preflight.py.

Core code: nothing here prints; the CLI renders :class:`DoctorReport`.

May import: nano/, tts/, quantize/, source/, gguf/, disk/, native/ and the top level (errors,
progress, report, hold_points) (rank 6); never verify/ (beside it), pipeline/ or cli/.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..progress import ProgressReporter, ensure
from ..report import FAIL, PASS, WARN, CheckRow, CheckRows
from .engines import (
    TREE_PORTABLE_FIX,
    auto_row,
    binary_row,
    cpu_row,
    library_row,
    llama_cpp_python_row,
    resolve_engine,
)
from .environment import (
    PACKAGES,
    cpu_fit_row,
    dist_version,
    gpu_rows,
    hub_rows,
    nvidia_gpus,
    onnxruntime_row,
    package_row,
    python_row,
    torch_row,
)
from .preflight import (
    REAL_MODEL,
    DiskPlan,
    disk_check,
    disk_rows,
    model_plan,
    preflight,
    quantize_bytes,
    real_model_plan,
)
from .runtime import (
    PORTABLE_BUILD_FIX,
    RECHECK_HINT,
    ProbeResult,
    build_probe_cmd,
    interpret_probe,
    probe_cache_path,
    probe_child_main,
    probe_detail,
    probe_key,
    read_cached_probe,
    run_probe,
    runtime_probe,
    write_probe_gguf,
)

__all__ = [
    "FAIL", "GROUPS", "PASS", "PORTABLE_BUILD_FIX", "REAL_MODEL", "RECHECK_HINT",
    "TREE_PORTABLE_FIX", "WARN", "DiskPlan", "DoctorReport", "DoctorRow", "ProbeResult",
    "nvidia_gpus", "build_probe_cmd", "cpu_fit_row", "disk_check", "doctor",
    "interpret_probe", "model_plan", "preflight", "probe_cache_path",
    "probe_child_main", "probe_key", "quantize_bytes", "read_cached_probe", "real_model_plan",
    "resolve_engine", "run_probe", "runtime_probe", "write_probe_gguf",
]  # fmt: skip

# the sections, in the order their rows are shown
GROUPS = ("versions", "engines", "runtime", "gpu", "disk", "hub")
DoctorRow = CheckRow  # (group, name, status, detail, fix)


@dataclass
class DoctorReport(CheckRows):
    rows: list[CheckRow] = field(default_factory=list)
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


def _version_rows(probe: ProbeResult, safe_import: bool) -> tuple[list[CheckRow], list | None]:
    rows = [CheckRow("versions", "moss-gguf", PASS, __version__), python_row()]
    rows += [package_row(*p) for p in PACKAGES[:4]]
    rows.append(llama_cpp_python_row(probe, safe_import))
    ort_row, providers = onnxruntime_row()
    rows.append(ort_row)
    rows += [package_row(*p) for p in PACKAGES[4:]]
    rows.append(torch_row())
    return rows, providers


def _engine_rows(probe: ProbeResult, safe_import: bool, llama_cpp: Path | None) -> list[CheckRow]:
    with tempfile.TemporaryDirectory(prefix="moss-gguf-doctor-") as tmp:
        rows = [binary_row(llama_cpp, Path(tmp))]
    rows.append(library_row(probe, safe_import))
    rows.append(auto_row(llama_cpp, safe_import))
    rows.append(
        CheckRow("runtime", "llama.cpp runtime", probe.status, probe_detail(probe), probe.fix)
    )
    rows.append(cpu_row(probe, safe_import))
    return rows


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
    safe_import = safe_import and dist_version("llama_cpp_python") is not None

    step(1)
    rows, providers = _version_rows(probe, safe_import)
    step(2)
    rows += _engine_rows(probe, safe_import, llama_cpp)
    step(3)
    rows += gpu_rows(safe_import, providers)
    step(4)
    rows += disk_rows(output)
    step(5)
    rows += hub_rows()
    report.rows = rows
    bar.advance("doctor", 1, description="doctor: done")
    bar.finish("doctor")
    report.seconds = time.perf_counter() - started
    return report
