"""`moss-gguf layout`: arrange the weights folder the llama.cpp backend runs from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..layout import CONFIG_NAME, LayoutMode, layout
from ..staging import human_bytes
from ._options import Force, Quiet, Verbose
from ._output import OutputMode, info, progress_for, setup_logging
from .app import command

EXAMPLES = """
[b]Examples[/b]

  moss-gguf layout --extracted weights/extracted --gguf weights/backbone_q4km.gguf \\
      --output weights/MOSS-TTS-Q4_K_M

  moss-gguf layout --extracted weights/extracted --gguf backbone_q4km.gguf --output w \\
      --mode copy --audio-tokenizer weights/MOSS-Audio-Tokenizer-ONNX
"""


@command(
    "layout",
    help="Arrange a weights folder as the guide's 'Using the Converted Weights' "
    "tree, with a synth config YAML and a manifest of every file's sha256.",
    epilog=EXAMPLES,
)
def layout_command(
    extracted: Annotated[Path, typer.Option("--extracted", help="Output folder of `extract`.")],
    gguf: Annotated[list[Path], typer.Option("--gguf", help="Backbone GGUF (repeatable).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Weights folder to create.")],
    mode: Annotated[
        LayoutMode,
        typer.Option(help="link: hard links where possible, else copies; copy; or move the files."),
    ] = LayoutMode.link,
    audio_tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Folder with the audio tokenizer's encoder.onnx and "
            "decoder.onnx (fills the YAML's ONNX paths)."
        ),
    ] = None,
    config_name: Annotated[str, typer.Option(help="File name of the synth YAML.")] = CONFIG_NAME,
    force: Force = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode_ = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode_)
    with progress_for(mode_) as bar:
        result = layout(
            extracted,
            gguf,
            output,
            mode=mode,
            audio_tokenizer=audio_tokenizer,
            config_name=config_name,
            force=force,
            progress=bar,
        )
    info(
        mode_,
        f"{len(result.entries)} files, {human_bytes(result.total_bytes)} "
        f"({result.linked} linked, {result.copied} copied, {result.moved} moved); "
        f"synth config: {result.config}",
    )
    typer.echo(str(result.output))
