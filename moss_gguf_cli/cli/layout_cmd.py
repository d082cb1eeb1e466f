"""`moss-gguf layout` (not built yet)."""

from __future__ import annotations

from ..errors import NotBuiltError
from .app import command


@command("layout", help="Not built yet.", add_help_option=True)
def layout_command() -> None:
    raise NotBuiltError("'moss-gguf layout' is not built yet in this version")
