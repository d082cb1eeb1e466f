"""The rows that join the probe with what is installed: quantize engines, llama-cpp-python, CPU."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..errors import MossGgufError, ToolError
from ..native import libllama
from ..native import llama_tools as lc
from ..quantize.engines import Engine, choose_engine
from ..report import FAIL, PASS, WARN, CheckRow
from .environment import cpu_fit_row, cpu_info, dist_version, error_row
from .runtime import PORTABLE_BUILD_FIX, ProbeResult, signal_name, write_probe_gguf

log = logging.getLogger(__name__)


TREE_PORTABLE_FIX = (
    "rebuild it with this CPU's flags: bash scripts/get-llama-cpp.sh "
    "(cmake with `python -m moss_gguf_cli.native.cpu_features`)"
)


def resolve_engine(engine: Engine | str, llama_cpp: Path | None) -> tuple[str, Path | None]:
    """Which engine `quantize --engine ENGINE` would use, and its binary: quantize's own rules."""
    choice = choose_engine(engine, llama_cpp, checkpoint=False)
    return choice.engine.value, choice.binary


def binary_row(llama_cpp: Path | None, workdir: Path) -> CheckRow:
    try:
        tree = lc.find_llama_cpp(llama_cpp)
    except ToolError as exc:
        return error_row("engines", "llama-quantize", exc)
    if tree is None or tree.quantize_bin is None:
        where = f" in {tree.root} ({tree.source})" if tree and tree.root else ""
        return CheckRow(
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
        return CheckRow("engines", "llama-quantize", FAIL, exc.message, lc.GET_SCRIPT_HINT)
    parser.close()
    if run.returncode < 0:
        name = signal_name(run.returncode)
        return CheckRow(
            "engines",
            "llama-quantize",
            FAIL,
            f"{exe} crashed ({name}) quantizing a tiny model: it was built for another CPU",
            TREE_PORTABLE_FIX,
        )
    if run.returncode != 0:
        return CheckRow(
            "engines",
            "llama-quantize",
            FAIL,
            f"{exe} failed (exit {run.returncode}): {lc.last_lines(run.tail, 2)}",
            lc.GET_SCRIPT_HINT,
        )
    version = parser.build or (lc.tree_version(tree.root) if tree.root else None)
    shown = version.describe().removeprefix("llama-quantize, ") if version else "version unknown"
    return CheckRow("engines", "llama-quantize", PASS, f"{exe} ({tree.source}; {shown})")


def library_row(probe: ProbeResult, safe_import: bool) -> CheckRow:
    version = dist_version("llama_cpp_python")
    if version is None:
        return CheckRow(
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
        return CheckRow("engines", "libllama", status, detail, probe.fix)
    lib = libllama.library_path()
    build = lc.library_version() if safe_import else None
    shown = build.describe() if build else f"llama-cpp-python {version}"
    return CheckRow("engines", "libllama", PASS, f"llama_model_quantize in {shown} ({lib})")


def auto_row(llama_cpp: Path | None, safe_import: bool) -> CheckRow:
    try:
        tree = lc.find_llama_cpp(llama_cpp)
    except MossGgufError as exc:
        return error_row("engines", "auto engine", exc)
    if not safe_import and (tree is None or tree.quantize_bin is None):
        return CheckRow(
            "engines",
            "auto engine",
            FAIL,
            "no usable engine: no llama-quantize, and importing llama-cpp-python crashed",
            f"reinstall a portable build: {PORTABLE_BUILD_FIX}",
        )
    try:
        engine, exe = resolve_engine(Engine.AUTO, llama_cpp)
    except MossGgufError as exc:
        return error_row("engines", "auto engine", exc)
    what = f"binary ({exe})" if exe else "library (llama-cpp-python's libllama, in-process)"
    return CheckRow("engines", "auto engine", PASS, f"`--engine auto` uses {what}")


def cpu_row(probe: ProbeResult, safe_import: bool) -> CheckRow:
    cpu = cpu_info()
    amx = sorted(f for f in cpu["flags"] if f.startswith("amx"))
    detail = f"{cpu['model']}, {os.cpu_count()} cores"
    if amx:
        detail += f", reports {'/'.join(amx)}"
    system_info = None
    if safe_import and dist_version("llama_cpp_python") is not None:
        llama_cpp = libllama.bindings()
        system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    if amx and probe.crashed:
        return CheckRow("runtime", "CPU", FAIL, detail, probe.fix)
    if system_info is None:
        return CheckRow("runtime", "CPU", PASS, detail)
    return cpu_fit_row(detail, system_info, cpu["flags"])


def llama_cpp_python_row(probe: ProbeResult, safe_import: bool) -> CheckRow:
    version = dist_version("llama_cpp_python")
    if version is None:
        return CheckRow(
            "versions",
            "llama-cpp-python",
            FAIL,
            "not installed (synth's backbone; quantize without llama-quantize)",
            f"install it (portable build): {PORTABLE_BUILD_FIX}",
        )
    if not safe_import:
        return CheckRow(
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
        return CheckRow(
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
    return CheckRow("versions", "llama-cpp-python", PASS, f"{version} (llama.cpp {carried})")
