"""`moss-gguf convert` (not built yet)."""

from __future__ import annotations

from ..errors import NotBuiltError
from .app import command


@command("convert", help="Not built yet.", add_help_option=True)
def convert_command() -> None:
    raise NotBuiltError("'moss-gguf convert' is not built yet in this version")
