"""The exception hierarchy. Core code raises these; `cli/_errors.py` renders them.

Every error carries a one-line message that names the offending file and, where
there is one, the fix (``hint``). Exit codes: 2 for bad input or usage, 1 for a
failure while doing valid work.
"""

from __future__ import annotations

import os
from pathlib import Path

# pyproject.toml's optional extras → the top-level modules each brings (a user path that
# imports one of them names the extra when it is missing: missing_package)
EXTRA_MODULES = {
    "serve": ("fastapi", "uvicorn", "starlette", "av", "multipart", "prometheus_client",
              "pydantic"),
    "torch": ("torch",),
}  # fmt: skip
PACKAGE = "moss_gguf_cli"


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


class TooMuchText(InputError):
    """Text that would pass its limit (a growing text's piece): refused, nothing taken."""


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


def extra_hint(extra: str) -> str:
    """How to add an extra to the installed moss-gguf (pip takes it from the installed
    package's own metadata; in the clone `pip install '.[EXTRA]'` does the same)."""
    return f"pip install 'moss-gguf[{extra}]'"


def missing_package(exc: ImportError) -> MossGgufError | None:
    """A module that is not installed, as one line: an extra's names the extra, any other
    (a dependency of the package itself) asks for the install again. None: not a missing
    module (a broken import inside the package is a bug, not an install)."""
    top = (exc.name or "").split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or not top or top == PACKAGE:
        return None
    for extra, modules in EXTRA_MODULES.items():
        if top in modules:
            return ToolError(f"this needs the {extra} extra ({top} is not installed)",
                             hint=extra_hint(extra))  # fmt: skip
    return ToolError(
        f"the Python package {top} is not installed, and moss-gguf needs it",
        hint="install moss-gguf again: bash scripts/install.sh",
    )
