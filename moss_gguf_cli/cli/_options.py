"""Options shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors and the final result.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="More detail while working.")]
Force = Annotated[
    bool, typer.Option("--force", help="Replace an existing output instead of refusing.")
]
Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="MOSS-TTS checkpoint: a local folder, a Hugging Face repo id, or builtin:tiny.",
    ),
]
Revision = Annotated[
    str | None, typer.Option("--revision", help="Hub revision (branch, tag or commit).")
]
CacheDir = Annotated[
    Path | None, typer.Option("--cache-dir", help="Hugging Face cache folder to use.")
]
LlamaCppDir = Annotated[
    Path | None,
    typer.Option(
        "--llama-cpp",
        help="A llama.cpp source/build tree (default: $LLAMA_CPP_DIR, then PATH).",
        file_okay=False,
    ),
]
