"""Every command's --help shows its examples (the epilog its module declares)."""

from __future__ import annotations

import pytest
from rich.text import Text
from typer.testing import CliRunner

from moss_gguf_cli.cli._command import COMMANDS
from moss_gguf_cli.cli.app import app

runner = CliRunner()


def _examples(epilog: str) -> list[str]:
    """The command lines of an epilog (the lines that start with `moss-gguf`), as shown."""
    lines = [Text.from_markup(line).plain.strip() for line in epilog.splitlines()]
    return [line for line in lines if line.startswith("moss-gguf ")]


def test_every_command_declares_examples() -> None:
    names = [name for name, _, _ in COMMANDS]
    assert {"extract", "convert", "quantize", "all", "layout", "verify", "synth", "serve",
            "doctor", "push"} <= set(names)  # fmt: skip
    for name, options, _ in COMMANDS:
        assert _examples(options.get("epilog") or ""), f"{name} declares no examples"


@pytest.mark.parametrize("name", [name for name, _, _ in COMMANDS])
def test_help_shows_the_examples(name: str) -> None:
    options = dict((n, o) for n, o, _ in COMMANDS)[name]
    result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    shown = " ".join(result.stdout.split())
    for line in _examples(options["epilog"]):
        assert " ".join(line.split()) in shown, f"{name} --help lacks: {line}"
