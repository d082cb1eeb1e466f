"""`moss-gguf doctor`: can this machine do the job? Checks with a one-line fix each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..doctor import PASS, DoctorReport, doctor
from ._command import command
from ._options import LlamaCppDir, Quiet, Verbose
from ._output import STATUS_STYLE as STYLE
from ._output import (
    OutputMode,
    finish_report,
    print_verdict,
    progress_for,
    setup_logging,
    stdout,
)

EXAMPLES = """
[b]Examples[/b]

  moss-gguf doctor

  moss-gguf doctor --output /data/weights [dim](is there room for `all` there?)[/dim]

  moss-gguf doctor --json > doctor.json

  moss-gguf doctor --llama-cpp ~/src/llama.cpp --recheck

The llama.cpp check runs a tiny model in a separate process (a crash there is
reported, not fatal) and is remembered per installed llama.cpp build; `all`,
`quantize` and `synth` reuse it before they start. Exit status: 0 unless a check
fails (1).
"""


@command(
    "doctor",
    help="Check this machine before a long run: versions, quantize engines, that llama.cpp "
    "actually runs here, GPU, free disk for the real model, Hugging Face Hub settings.",
    epilog=EXAMPLES,
)
def doctor_command(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Where `all` would write (default: the current folder)."
        ),
    ] = None,
    llama_cpp: LlamaCppDir = None,
    recheck: Annotated[
        bool, typer.Option("--recheck", help="Run the llama.cpp check again, ignoring its cache.")
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (and nothing else).")
    ] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose, json=json_)
    setup_logging(mode)
    with progress_for(mode) as bar:
        report = doctor(output=output, llama_cpp=llama_cpp, recheck=recheck, progress=bar)
    finish_report(report, render, json_=json_, quiet=quiet)


def render(report: DoctorReport, *, quiet: bool = False) -> None:
    rows = [r for r in report.rows if not quiet or r.status != PASS]
    if rows:
        table = Table(title="moss-gguf doctor", title_justify="left")
        table.add_column("group", style="dim")
        table.add_column("check")
        table.add_column("status")
        table.add_column("detail / fix", overflow="fold")
        for r in rows:
            text = escape(r.detail)
            if r.status != PASS and r.fix:
                text += f"\n[b]fix:[/b] {escape(r.fix)}"
            table.add_row(r.group, r.name, f"[{STYLE[r.status]}]{r.status}[/]", text)
        stdout.print(table, markup=True)
    print_verdict(report, report.seconds, passed="ready", failed="not ready")
