"""The Typer app: imports each command's module and registers what it declared."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from ._command import COMMANDS

app = typer.Typer(
    name="moss-gguf",
    help="Turn MOSS-TTS (Hugging Face safetensors) into llama.cpp GGUF + NumPy tables, "
    "verify the result and speak with it.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"moss-gguf {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = None,
) -> None:
    """moss-gguf: MOSS-TTS → GGUF, verified, and spoken."""


def _register() -> None:
    # Importing a command module puts it in COMMANDS; the app imports them, never the reverse.
    from . import (  # noqa: F401
        all_cmd,
        convert_cmd,
        doctor_cmd,
        extract_cmd,
        layout_cmd,
        push_cmd,
        quantize_cmd,
        serve_cmd,
        synth_cmd,
        verify_cmd,
    )

    for name, kwargs, wrapper in COMMANDS:
        app.command(name, **kwargs)(wrapper)


_register()


def main() -> None:
    app()
