"""The `command` decorator: declares a command; cli/app.py registers every declared one.

Command modules import this, not the app, so the app can import them without a cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer

from ._errors import fail

# (name, Typer command options, wrapped function), in declaration order
COMMANDS: list[tuple[str, dict[str, Any], Callable]] = []


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

        COMMANDS.append((name, kwargs, wrapper))
        return fn

    return decorate


