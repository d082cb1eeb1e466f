"""Named hold points: where a test can stop a real run at a known moment, without racing it.

``MOSS_GGUF_HOLD=NAME=MARKER`` makes the first thread that reaches ``hold(NAME)`` write its
process id to the file MARKER (atomically) and wait there until the process is signalled.
A test starts the command, waits for MARKER, then sends SIGKILL or SIGINT: the run is
certainly inside that step, however fast or slow the machine. Without the variable (every
real run) ``hold`` returns at once.

The points, each placed where the step's partial output already exists:
``extract`` (a table written), ``convert`` (a tensor written), ``quantize`` (a tensor
quantized), ``layout`` (a file placed), ``verify`` (the folder complete, before its checks),
``serve`` (a request generating: its first step done, in the server's worker thread).
"""

from __future__ import annotations

import os
import threading
import time

ENV = "MOSS_GGUF_HOLD"
POINTS = ("extract", "convert", "quantize", "layout", "verify", "serve")

_lock = threading.Lock()
_reached: set[str] = set()
# Taken out of the environment as the package is imported (moss_gguf_cli/__init__.py), so
# the processes a run starts (doctor's probe quantizes too) never hold in its place.
_SPEC = os.environ.pop(ENV, "")


def hold(point: str) -> None:
    """Wait here forever if ``$MOSS_GGUF_HOLD`` named this point (first arrival only)."""
    spec = _SPEC
    if not spec:
        return
    name, sep, marker = spec.partition("=")
    if name != point or not sep:
        return
    with _lock:
        if point in _reached:
            return
        _reached.add(point)
    tmp = f"{marker}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, marker)
    while True:  # short sleeps: a SIGINT reaches the main thread between them
        time.sleep(0.05)
