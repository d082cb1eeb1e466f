"""libllama as llama-cpp-python ships it: the one place its bindings are imported, the one
ctypes handle for the ggml calls they do not bind, and the one process-wide log hook.

llama.cpp keeps a single log callback per process (`llama_log_set`). Only this module sets
it: `route_log` hands llama.cpp's log to a Python function (the quantize engines while
libllama quantizes, tts's backbone for good), `restore_log` gives it back to the one routed
before (so a quantize in a process that speaks leaves the backbone's hook in place), or to
llama-cpp-python's own logger. A callback llama.cpp holds is kept referenced here as long
as llama.cpp may call it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_held: list[Any] = []  # callbacks (and what they point into) llama.cpp may still call
_routes: list[Any] = []  # the callbacks route_log installed and restore_log has not undone


def bindings() -> ModuleType:
    """llama-cpp-python's `llama_cpp` module; importing it loads libllama (and may raise
    anything a broken install raises)."""
    import llama_cpp

    return llama_cpp


def library_path() -> Path | None:
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


def handle() -> ctypes.CDLL | None:
    """The loaded libllama itself, for ggml calls llama-cpp-python does not bind (None when
    it cannot be found). The bindings load it first; dlopen then hands back that handle."""
    bindings()
    path = library_path()
    return ctypes.CDLL(str(path)) if path is not None else None


def route_log(on_log: Callable[[int, bytes], None]) -> Any:
    """From now on llama.cpp's log lines go to ON_LOG(level, text), on whichever thread
    logs. Returns the callback llama.cpp holds (for `restore_log`)."""
    llama_cpp = bindings()

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        on_log(level, text)

    with _lock:
        _held.append(callback)
        _routes.append(callback)
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    return callback


def restore_log(callback: Any) -> None:
    """CALLBACK undone and released: llama.cpp logs to the hook routed before it, else to
    llama-cpp-python's own logger."""
    with _lock:
        if callback in _routes:
            _routes.remove(callback)
        try:
            from llama_cpp import _logger, llama_log_set

            previous = _routes[-1] if _routes else _logger.llama_log_callback
            llama_log_set(previous, ctypes.c_void_p(0))
        except Exception:  # noqa: BLE001 - only the library's default logger is lost
            pass
        if callback in _held:
            _held.remove(callback)


def hold_for_good(*objects: Any) -> None:
    """Keep OBJECTS alive for the rest of the process: a libllama call still running (an
    interrupted quantize) may use them, and its callback, at any time."""
    with _lock:
        _held.extend(objects)
