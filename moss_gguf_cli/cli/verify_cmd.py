"""`moss-gguf verify` (not built yet)."""

from __future__ import annotations

from ..errors import NotBuiltError
from .app import command


@command("verify", help="Not built yet.", add_help_option=True)
def verify_command() -> None:
    raise NotBuiltError("'moss-gguf verify' is not built yet in this version")
