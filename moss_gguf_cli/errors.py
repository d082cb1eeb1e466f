"""The exception hierarchy. Core code raises these; `cli/_errors.py` renders them.

Every error carries a one-line message that names the offending file and, where
there is one, the fix (``hint``). Exit codes: 2 for bad input or usage, 1 for a
failure while doing valid work.
"""

from __future__ import annotations

import os
from pathlib import Path


def is_debug() -> bool:
    """MOSS_GGUF_DEBUG=1: show tracebacks (the CLI's and the server's)."""
    return os.environ.get("MOSS_GGUF_DEBUG", "") not in ("", "0")


class MossGgufError(Exception):
    """Base class: a failure the user can act on."""

    exit_code = 1

    def __init__(self, message: str, *, path: str | Path | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.path = str(path) if path is not None else None
        self.hint = hint

    def one_line(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.hint:
            text += f" ({self.hint})"
        return " ".join(text.split())  # one line, whatever the parts held


class UsageError(MossGgufError):
    """Options that do not fit together, a missing argument, an unknown choice."""

    exit_code = 2


class InputError(MossGgufError):
    """An input file or folder that is missing, malformed or of the wrong kind."""

    exit_code = 2


class UnsupportedModelError(InputError):
    """A checkpoint that looks like MOSS but is not a delay model we convert."""


class OutputError(MossGgufError):
    """The output cannot be written: it exists, is not writable, or the disk is full."""

    exit_code = 1


class NumericError(MossGgufError):
    """Values that cannot be stored in the requested type (overflow, NaN, Inf)."""

    exit_code = 1


class ToolError(MossGgufError):
    """An external tool (llama.cpp, onnxruntime) is missing or failed."""

    exit_code = 1
