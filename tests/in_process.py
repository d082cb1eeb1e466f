"""`moss-gguf` run inside the test process: the Typer app with its one catch point (`@command`),
so a refusal costs no interpreter start. tests/test_in_process.py proves a child process renders
the same exit codes, stdout and stderr; tests whose subject is the process itself (signals, kill
and resume, the console script, servers) start one.
"""

from __future__ import annotations

from dataclasses import dataclass

from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app


@dataclass(frozen=True)
class Ran:
    """What a run left: the fields of a text-mode subprocess.CompletedProcess the tests read."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def moss_gguf(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Ran:
    """`moss-gguf ARGS` with ENV added to the environment while it runs."""
    # catch_exceptions=False: anything past the catch point fails the test where it happened
    result = CliRunner().invoke(app, list(args), env=env, input=input, catch_exceptions=False)
    return Ran(tuple(args), result.exit_code, result.stdout, result.stderr)
