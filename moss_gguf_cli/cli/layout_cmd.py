"""`moss-gguf layout`: arrange the weights folder the llama.cpp backend runs from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..disk.staging import human_bytes
from ..errors import UsageError
from ..pipeline.card import CardFacts, card_source, write_card
from ..pipeline.layout import CONFIG_NAME, LayoutMode, add_audio_tokenizer, layout, read_meta
from ..source.audio_tokenizer import DEFAULT_REPO, parse_flag, resolve
from ._command import command
from ._options import Force, Quiet, Verbose
from ._output import OutputMode, command_line, info, progress_for, setup_logging

EXAMPLES = """
[b]Examples[/b]

  moss-gguf layout --extracted weights/extracted --gguf weights/backbone_q4km.gguf \\
      --output weights/MOSS-TTS-Q4_K_M

  moss-gguf layout --extracted weights/extracted --gguf backbone_q4km.gguf --output w \\
      --mode copy --audio-tokenizer weights/MOSS-Audio-Tokenizer-ONNX

  # add the audio tokenizer to a finished weights folder (one made with --audio-tokenizer none)
  moss-gguf layout --output weights/MOSS-TTS-Q4_K_M \
      --audio-tokenizer OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX
"""


@command(
    "layout",
    help="Arrange a weights folder as the guide's 'Using the Converted Weights' "
    "tree, with a synth config YAML and a manifest of every file's sha256.",
    epilog=EXAMPLES,
)
def layout_command(
    extracted: Annotated[
        Path | None, typer.Option("--extracted", help="Output folder of `extract`.")
    ] = None,
    gguf: Annotated[
        list[Path] | None, typer.Option("--gguf", help="Backbone GGUF (repeatable).")
    ] = None,
    *,
    output: Annotated[Path, typer.Option("--output", "-o", help="Weights folder to create.")],
    mode: Annotated[
        LayoutMode,
        typer.Option(help="link: hard links where possible, else copies; copy; or move the files."),
    ] = LayoutMode.link,
    audio_tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Audio tokenizer: a folder with its encoder and decoder .onnx, a Hub repo id "
            f"(default {DEFAULT_REPO}), or none.",
        ),
    ] = None,
    revision: Annotated[
        str | None, typer.Option("--audio-tokenizer-revision", help="Its Hub revision.")
    ] = None,
    config_name: Annotated[str, typer.Option(help="File name of the synth YAML.")] = CONFIG_NAME,
    base_model: Annotated[
        str | None,
        typer.Option(help="The Hub repo the checkpoint was taken from, for the model card."),
    ] = None,
    force: Force = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode_ = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode_)
    spec = parse_flag(audio_tokenizer)
    if extracted is None and not gguf:
        if spec is None:
            raise UsageError(
                "nothing to lay out", hint="pass --extracted and --gguf, or --audio-tokenizer"
            )
        with progress_for(mode_) as bar:
            codec = resolve(spec, builtin=False, revision=revision, progress=bar)
            if codec is None:
                raise UsageError("--audio-tokenizer none adds nothing")
            added = add_audio_tokenizer(output, codec, progress=bar)
        info(mode_, f"audio tokenizer {codec.source}: {len(codec.files)} files; "
             f"{len(added.configs)} synth configs updated")
        typer.echo(str(added.output))
        return
    if extracted is None or not gguf:
        raise UsageError("--extracted and --gguf go together", hint="pass both")
    # the default codec is the model's: the tiny one for builtin models, else the Hub's ONNX
    source = str(read_meta(extracted).get("source_model") or "")
    card = card_source(source, None, None, base_model)  # a bad --base-model fails first
    with progress_for(mode_) as bar:
        codec = resolve(
            spec, builtin=source.startswith("builtin:"), revision=revision, progress=bar
        )
        result = layout(
            extracted,
            gguf,
            output,
            mode=mode,
            audio_tokenizer=codec,
            config_name=config_name,
            force=force,
            progress=bar,
        )
    not_run = f"not run yet: moss-gguf verify {result.output}"
    write_card(result.output, CardFacts(card, not_run, command_line()))
    for note in card.notes:
        info(mode_, f"note: {note}")
    info(
        mode_,
        f"{len(result.entries)} files, {human_bytes(result.total_bytes)} "
        f"({result.linked} linked, {result.copied} copied, {result.moved} moved); "
        f"synth config: {result.config}",
    )
    typer.echo(str(result.output))
