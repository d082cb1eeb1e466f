"""`moss-gguf extract`: split a MOSS-TTS checkpoint into backbone, embeddings and heads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..disk.staging import human_bytes
from ..pipeline.extract import DEFAULT_MAX_SHARD, extract
from ..source.checkpoint import resolve_model
from ._command import command
from ._options import CacheDir, Force, Model, Quiet, Revision, Verbose
from ._output import OutputMode, info, progress_for, setup_logging

EXAMPLES = """
[b]Examples[/b]

  moss-gguf extract --model OpenMOSS-Team/MOSS-TTS --output weights/extracted

  moss-gguf extract --model /path/to/MOSS-TTS --output weights/extracted --npy-dtype float32

  moss-gguf extract --model builtin:tiny --output /tmp/tiny-extracted
"""


@command(
    "extract",
    help="Split a MOSS-TTS checkpoint into a Qwen3 backbone (safetensors), "
    "33 embedding tables and 33 LM heads (.npy), exactly as the conversion guide's step 1.",
    epilog=EXAMPLES,
)
def extract_command(
    model: Model,
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to create.")],
    revision: Revision = None,
    cache_dir: CacheDir = None,
    max_shard_size: Annotated[
        str, typer.Option(help="Largest backbone shard, e.g. 5GB or 500MB.")
    ] = f"{DEFAULT_MAX_SHARD // 1000**3}GB",
    npy_dtype: Annotated[
        str, typer.Option(help="dtype of the .npy tables: float16 (as the guide) or float32.")
    ] = "float16",
    force: Force = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode)
    with progress_for(mode) as bar:
        source = resolve_model(model, revision=revision, cache_dir=cache_dir, progress=bar)
        result = extract(
            source,
            output,
            max_shard_size=max_shard_size,
            npy_dtype=npy_dtype,
            force=force,
            source_model=model,
            progress=bar,
        )
    info(
        mode,
        f"extracted n_vq={result.n_vq} model: {len(result.backbone_shards)} backbone "
        f"shard(s), {len(result.npy_files)} .npy tables ({result.npy_dtype}), "
        f"{human_bytes(result.bytes_written)} in {result.seconds:.1f} s",
    )
    typer.echo(str(result.output))
