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

Failure points (``fail(NAME)``) make a real run fail there instead, once: the first thread
that reaches one named by ``MOSS_GGUF_HOLD=NAME=MARKER`` writes MARKER and raises
`InjectedFailure`. ``row`` fails one utterance's own part of an engine step (its row taken),
``decode`` the step's shared backbone decode: the failure paths no well-formed request reaches.
"""

from __future__ import annotations

import os
import threading
import time

ENV = "MOSS_GGUF_HOLD"
POINTS = ("extract", "convert", "quantize", "layout", "verify", "serve")
FAIL_POINTS = ("row", "decode")

_lock = threading.Lock()
_reached: set[str] = set()
# Taken out of the environment as the package is imported (moss_gguf_cli/__init__.py), so
# the processes a run starts (doctor's probe quantizes too) never hold in its place.
_SPEC = os.environ.pop(ENV, "")


class InjectedFailure(RuntimeError):
    """The failure a test asked for at a failure point."""


def _first_arrival(point: str) -> str | None:
    """The marker file if ``$MOSS_GGUF_HOLD`` names POINT and this is its first arrival."""
    spec = _SPEC
    if not spec:
        return None
    name, sep, marker = spec.partition("=")
    if name != point or not sep:
        return None
    with _lock:
        if point in _reached:
            return None
        _reached.add(point)
    tmp = f"{marker}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, marker)
    return marker


def fail(point: str) -> None:
    """Raise InjectedFailure if ``$MOSS_GGUF_HOLD`` named this failure point (first arrival)."""
    if _first_arrival(point) is not None:
        raise InjectedFailure(f"a failure injected at {point!r} (MOSS_GGUF_HOLD)")


def hold(point: str) -> None:
    """Wait here forever if ``$MOSS_GGUF_HOLD`` named this point (first arrival only)."""
    if _first_arrival(point) is None:
        return
    while True:  # short sleeps: a SIGINT reaches the main thread between them
        time.sleep(0.05)
