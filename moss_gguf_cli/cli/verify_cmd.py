"""`moss-gguf verify`: check a converted model; exit 0 when nothing fails, 1 when a check does."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..families import for_folder
from ..verify import PASS, VerifyReport
from ._command import command
from ._options import Quiet, Verbose
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

  moss-gguf verify weights/MOSS-TTS-Q4_K_M

  moss-gguf verify weights/MOSS-TTS-Q4_K_M --source OpenMOSS-Team/MOSS-TTS --deep

  moss-gguf verify weights/MOSS-TTS-Q4_K_M/moss-tts.yaml --json > report.json

  moss-gguf verify weights/backbone_q4km.gguf --source /path/to/MOSS-TTS

  moss-gguf verify /tmp/tiny-weights --source builtin:tiny --deep

Exit status: 0 when no check fails, 1 when one does, 2 for bad usage.
"""


@command(
    "verify",
    help="Check a weights folder, a synth config YAML, an extract folder or a GGUF: files, "
    ".npy tables, GGUF metadata and tensors, tokenizer and manifest; with --source, every "
    "tensor against the checkpoint; with --deep, the backbone in llama.cpp against a torch "
    "reference.",
    epilog=EXAMPLES,
)
def verify_command(
    target: Annotated[
        Path,
        typer.Argument(
            help="Weights folder, synth config YAML, extract folder or GGUF.", show_default=False
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            "-s",
            help="The MOSS-TTS checkpoint it came from (folder, Hub id or builtin:tiny): "
            "compare every table and tensor with it.",
        ),
    ] = None,
    json_: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (and nothing else).")
    ] = False,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep",
            help="Run the GGUF in llama.cpp on a short prompt and compare its hidden state and "
            "audio logits with a torch forward of the source: --source, else the local "
            "source_model recorded in extraction_meta.json (adds the --source checks; needs "
            "torch).",
        ),
    ] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose, json=json_)
    setup_logging(mode)
    with progress_for(mode) as bar:
        report = for_folder(target).verify(target, source, deep, bar)
    finish_report(report, render, json_=json_, quiet=quiet)


def render(report: VerifyReport, *, quiet: bool = False) -> None:
    rows = [r for r in report.rows if not quiet or r.status != PASS]
    if rows:
        table = Table(title=f"verify {report.target} ({report.kind})", title_justify="left")
        table.add_column("check", no_wrap=True)
        table.add_column("status")
        table.add_column("detail", overflow="fold")
        for i, r in enumerate(rows):
            if i and r.group != rows[i - 1].group:
                table.add_section()
            table.add_row(r.name, f"[{STYLE[r.status]}]{r.status}[/]", r.detail)
        stdout.print(table)
    if report.quality is not None and report.quality.tensors and not quiet:
        q = Table(title="quality against the source", title_justify="left")
        for col in ("type", "tensors", "mean rel. RMSE", "max rel. RMSE", "min cosine", "limit"):
            q.add_column(col, justify="left" if col == "type" else "right")
        for name, s in report.quality.by_type.items():
            q.add_row(
                name,
                str(s["tensors"]),
                f"{s['mean_rel_rmse']:.4f}",
                f"{s['max_rel_rmse']:.4f}",
                f"{s['min_cosine']:.5f}",
                f"{s['threshold_rel_rmse']:g}",
            )
        stdout.print(q)
    print_verdict(report, report.seconds, passed="OK", failed="FAILED", of_all=True)
