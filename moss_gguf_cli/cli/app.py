"""Registers the commands. Each command lives in its own small module."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated

import typer

from .. import __version__
from ._errors import fail

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


def command(name: str, **kwargs) -> Callable:
    """Register a command whose errors all go through the one catch point."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kw):
            try:
                return fn(*args, **kw)
            except (typer.Exit, typer.Abort, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - rendered as one line, exit code kept
                fail(exc)

        app.command(name, **kwargs)(wrapper)
        return fn

    return decorate


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
    # Importing a command module registers it through `command`.
    from . import (  # noqa: F401
        all_cmd,
        convert_cmd,
        doctor_cmd,
        extract_cmd,
        layout_cmd,
        quantize_cmd,
        synth_cmd,
        verify_cmd,
    )


_register()


def main() -> None:
    app()
