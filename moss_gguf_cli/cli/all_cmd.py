"""`moss-gguf all` (not built yet)."""

from __future__ import annotations

from ..errors import NotBuiltError
from .app import command


@command("all", help="Not built yet.", add_help_option=True)
def all_command() -> None:
    raise NotBuiltError("'moss-gguf all' is not built yet in this version")
