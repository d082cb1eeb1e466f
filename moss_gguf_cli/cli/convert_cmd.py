"""`moss-gguf convert`: the Qwen3 backbone → GGUF (the conversion guide's step 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..disk.staging import human_bytes
from ..errors import UsageError
from ..gguf.codec import FORMAT as CODEC_FORMAT
from ..gguf.first_class import FORMAT
from ..pipeline.audio_codec import convert_codec
from ..pipeline.convert import convert
from ..pipeline.first_class import convert_first_class, parse_formats
from ..pipeline.lora_convert import FORMAT as LORA_FORMAT
from ..pipeline.lora_convert import convert_lora
from ..source.checkpoint import BUILTIN_PREFIX, resolve_model
from ._command import command
from ._options import Force, LlamaCppDir, Quiet, Verbose
from ._output import OutputMode, info, progress_for, setup_logging

EXAMPLES = """
[b]Examples[/b]

  moss-gguf convert extracted --outfile backbone_f16.gguf --outtype f16

  moss-gguf convert extracted/qwen3_backbone -o backbone_q8_0.gguf -t q8_0

  moss-gguf convert /path/to/MOSS-TTS -o backbone_bf16.gguf --outtype bf16
  [dim](straight from the source checkpoint: no extract step, no copy)[/dim]

  moss-gguf convert extracted -o backbone_f16.gguf --engine llama.cpp
  [dim](runs convert_hf_to_gguf.py from --llama-cpp DIR or $LLAMA_CPP_DIR)[/dim]

  moss-gguf convert /path/to/MOSS-TTS -o moss-tts-delay_f16.gguf --format moss-tts-delay
  [dim](the whole model as one first-class GGUF for OpenMOSS's llama.cpp fork)[/dim]

  moss-gguf convert OpenMOSS-Team/MOSS-Audio-Tokenizer --format moss-tts-audio-codec -o codec
  [dim](the audio tokenizer as the fork's encoder and decoder GGUFs, in the folder codec/)[/dim]

  moss-gguf convert ./my-lora --format lora --base OpenMOSS-Team/MOSS-TTS -o my-lora.gguf
  [dim](a PEFT LoRA adapter as llama.cpp's adapter GGUF, for synth/serve --lora)[/dim]

[b]INPUT[/b] is an extracted qwen3_backbone/ folder, a whole extract output folder, a \
MOSS-TTS checkpoint folder, or builtin:tiny.

[b]Engines[/b]: [i]native[/i] (default) streams the GGUF itself, with the tensors, types \
and metadata of llama.cpp's converter and without llama.cpp, torch or transformers; \
[i]llama.cpp[/i] runs DIR/convert_hf_to_gguf.py from --llama-cpp DIR or $LLAMA_CPP_DIR.

[b]Formats[/b]: [i]backend[/i] (default) is the Qwen3 backbone alone, for the llama.cpp \
backend beside the .npy tables; [i]moss-tts-delay[/i] is the first-class GGUF of OpenMOSS's \
llama.cpp fork (llama-moss-tts): backbone, audio embeddings and heads in one file, byte for \
byte as the fork's converter writes it (INPUT: a MOSS-TTS checkpoint; native engine); \
[i]moss-tts-audio-codec[/i] is the PyTorch MOSS Audio Tokenizer (INPUT: its folder or Hub \
repo) as the fork's two GGUFs, NAME-encoder-OUTTYPE.gguf and NAME-decoder-OUTTYPE.gguf in \
the folder -o names (f16 or f32), byte for byte as the fork's split converter writes them; \
[i]lora[/i] is a PEFT LoRA adapter (INPUT: its folder or Hub id) as llama.cpp's adapter GGUF \
for the base --base names (f32 by default, as llama.cpp's convert_lora_to_gguf.py).
"""


@command(
    "convert",
    help="Convert the Qwen3 backbone to a GGUF (f16, bf16, f32 or q8_0), as the conversion "
    "guide's step 2 with llama.cpp's convert_hf_to_gguf.py, or natively.",
    epilog=EXAMPLES,
)
def convert_command(
    input: Annotated[
        str,
        typer.Argument(
            help="Extracted qwen3_backbone/ folder, extract output folder, MOSS-TTS "
            "checkpoint folder, or builtin:tiny.",
            metavar="INPUT",
            show_default=False,
        ),
    ],
    outfile: Annotated[
        Path,
        typer.Option(
            "--outfile", "-o", help="The GGUF file to write (moss-tts-audio-codec: a folder)."
        ),
    ],
    outtype: Annotated[
        str | None,
        typer.Option(
            "--outtype",
            "-t",
            help="f16, bf16, f32 or q8_0 (default f16; lora: f32).",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="native (default) or llama.cpp.")
    ] = "native",
    llama_cpp: LlamaCppDir = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="backend (the Qwen3 backbone; default), moss-tts-delay (first-class), "
            "moss-tts-audio-codec (the audio tokenizer's encoder and decoder GGUFs) or lora "
            "(a PEFT LoRA adapter as llama.cpp's adapter GGUF).",
        ),
    ] = "backend",
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="--format lora: the MOSS checkpoint (folder or Hub id) "
            "the adapter was trained on.",
            show_default=False,
        ),
    ] = None,
    force_base: Annotated[
        bool,
        typer.Option(help="--format lora: convert an adapter whose base_model_name_or_path "
                     "names another model than --base (warned)."),
    ] = False,
    force: Force = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode)
    if fmt.strip().lower() == LORA_FORMAT:
        _lora(input, base, outfile, outtype or "f32", force, force_base, mode)
        return
    if base is not None or force_base:
        flag = "--base" if base is not None else "--force-base"
        raise UsageError(f"{flag} is for --format lora", hint=f"drop {flag}")
    outtype = outtype or "f16"
    if fmt.strip().lower() == CODEC_FORMAT:
        _codec(input, outfile, outtype, engine, force, mode)
        return
    if parse_formats([fmt]) == [FORMAT]:
        _first_class(input, outfile, outtype, engine, force, mode)
        return
    with progress_for(mode) as bar:
        source = resolve_model(input) if input.startswith(BUILTIN_PREFIX) else Path(input)
        result = convert(
            source,
            outfile,
            outtype=outtype,
            engine=engine,
            llama_cpp=llama_cpp,
            force=force,
            progress=bar,
        )
    types = ", ".join(f"{n} {name}" for name, n in sorted(result.tensor_types.items()))
    info(
        mode,
        f"converted {result.source_kind} → {result.outtype} GGUF with the {result.engine} "
        f"engine: {result.n_tensors} tensors ({types}), {human_bytes(result.bytes_written)} "
        f"in {result.seconds:.1f} s",
    )
    typer.echo(str(result.outfile))


def _first_class(
    input: str, outfile: Path, outtype: str, engine: str, force: bool, mode: OutputMode
) -> None:
    if engine != "native":
        raise UsageError(
            f"--format {FORMAT} is written by the native engine only",
            hint="the stock llama.cpp converter does not know the architecture; drop --engine",
        )
    with progress_for(mode) as bar:
        model = resolve_model(input) if input.startswith(BUILTIN_PREFIX) else Path(input)
        r = convert_first_class(model, outfile, outtype, force=force, progress=bar)
    types = ", ".join(f"{n} {name}" for name, n in sorted(r.tensor_types.items()))
    info(
        mode,
        f"converted to a {FORMAT} {r.outtype} GGUF: {r.n_tensors} tensors ({types}), "
        f"{human_bytes(r.bytes_written)} in {r.seconds:.1f} s",
    )
    typer.echo(str(r.outfile))


def _codec(
    input: str, outdir: Path, outtype: str, engine: str, force: bool, mode: OutputMode
) -> None:
    if engine != "native":
        raise UsageError(
            f"--format {CODEC_FORMAT} is written by the native engine only", hint="drop --engine"
        )
    with progress_for(mode) as bar:
        r = convert_codec(input, outdir, outtype, force=force, progress=bar)
    info(
        mode,
        f"converted the audio tokenizer to the fork's {r.outtype} encoder "
        f"({r.n_tensors['encoder']} tensors) and decoder ({r.n_tensors['decoder']} tensors), "
        f"{human_bytes(r.bytes_written)} in {r.seconds:.1f} s",
    )
    typer.echo(str(r.encoder))
    typer.echo(str(r.decoder))


def _lora(input: str, base: str | None, outfile: Path, outtype: str, force: bool,
          force_base: bool, mode: OutputMode) -> None:  # fmt: skip
    with progress_for(mode) as bar:
        r = convert_lora(input, base, outfile, outtype, force=force, force_base=force_base,
                         progress=bar)  # fmt: skip
    for note in r.notes:
        info(mode, note)
    info(
        mode,
        f"converted the adapter to a {r.outtype} LoRA GGUF: {r.n_tensors} tensors, alpha "
        f"{r.alpha:g}, for {r.identity.model or 'the base in ' + str(base)}, "
        f"{human_bytes(r.bytes_written)} in {r.seconds:.1f} s",
    )
    typer.echo(str(r.outfile))
