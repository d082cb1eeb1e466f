"""`moss-gguf all`: from a MOSS-TTS checkpoint to a verified, quantized weights folder."""

from __future__ import annotations

from functools import singledispatch
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..disk.staging import human_bytes
from ..errors import UsageError
from ..families import FAMILIES, for_input
from ..gguf.first_class import FORMAT
from ..pipeline.audio_codec import DEFAULT_REPO as CODEC_REPO
from ..pipeline.first_class import FirstClassFolder, parse_formats
from ..pipeline.push import hub_token, plan_push, push
from ..pipeline.recipes import Recipe, load_recipe
from ..pipeline.route import AllOutcome, AllRequest
from ..pipeline.run import AllResult, AllSettings
from ..pipeline.summary import FolderSummary
from ..quantize.engines import Engine
from ..source.audio_tokenizer import DEFAULT_REPO, parse_flag
from ._command import command
from ._options import CacheDir, Force, LlamaCppDir, Quiet, Revision, Verbose
from ._output import OutputMode, command_line, info, progress_for, setup_logging, stdout

# each family's default codec, for --audio-tokenizer's help
CODECS = "; ".join(f"{f.title}: {f.audio_tokenizer}" for f in FAMILIES)

EXAMPLES = """
[b]Examples[/b]

  moss-gguf all --model builtin:tiny --output weights-demo

  moss-gguf all --model OpenMOSS-Team/MOSS-TTS --output weights/MOSS-TTS-GGUF

  moss-gguf all --model /path/to/MOSS-TTS --output w --file-type Q4_K_M --file-type Q8_0 \\
      --audio-tokenizer /path/to/MOSS-Audio-Tokenizer-ONNX

  moss-gguf all --model OpenMOSS-Team/MOSS-TTS-GGUF --output weights/MOSS-TTS-GGUF

  moss-gguf all --config configs/recipes/MOSS-TTS-Q4_K_M.yaml --output weights/MOSS-TTS-Q4_K_M

  moss-gguf all --model OpenMOSS-Team/MOSS-TTS --output w --format moss-tts-delay \\
      --file-type Q4_K_M --file-type F16
  [dim](first-class GGUFs for OpenMOSS's llama.cpp fork, llama-moss-tts)[/dim]

  moss-gguf all --model builtin:tiny --output w --format moss-tts-delay \\
      --audio-tables-type f16
  [dim](Q4_K_M backbone, audio embeddings and heads kept in f16)[/dim]

  moss-gguf all --model OpenMOSS-Team/MOSS-TTS --output w --format moss-tts-delay \\
      --pytorch-audio-tokenizer OpenMOSS-Team/MOSS-Audio-Tokenizer
  [dim](and the audio tokenizer as the fork's native encoder/decoder GGUFs)[/dim]

  moss-gguf all --model OpenMOSS-Team/MOSS-TTS-Nano-100M --output w-nano
  [dim](MOSS-TTS-Nano: its own folder, a Q8_0 global GGUF beside float32 arrays; docs/nano.md)[/dim]

  moss-gguf all --model OpenMOSS-Team/MOSS-TTS --output w-no \\
      --merge-lora ToSee-Norway/MOSS-TTS-Norwegian-LoRA
  [dim](a fine-tuned voice: the adapter merged in float32 before quantizing, one read)[/dim]

  moss-gguf all --model w/moss-tts-delay_q4_k_m.gguf --output w-backend
  [dim](a first-class GGUF, folder or Hub repo read back into the layout synth speaks)[/dim]

Several --file-type values cost one read of the checkpoint: the direct engine writes them all in
one pass, with no intermediate GGUF on disk. --format moss-tts-delay writes the first-class
GGUF instead (F16/BF16 are its unquantized files); with --format backend too, that folder
goes into OUTPUT/moss-tts-delay/, both from the same read of the checkpoint. An interrupted
run resumes where it stopped when run again; --force starts over.
"""


@command(
    "all",
    help="Extract, convert, quantize, lay out and verify in one resumable run.",
    epilog=EXAMPLES,
)
def all_command(
    output: Annotated[Path, typer.Option("--output", "-o", help="Weights folder to create.")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="MOSS-TTS checkpoint or pre-converted repo: a local folder, a Hugging Face "
            "repo id, builtin:tiny, or MOSS-TTS-Nano (a folder, OpenMOSS-Team/MOSS-TTS-Nano-100M "
            "or builtin:tiny-nano) (default: the recipe's).",
        ),
    ] = None,
    recipe: Annotated[
        Path | None,
        typer.Option("--config", help="A recipe YAML (configs/recipes/); flags override its keys."),
    ] = None,
    file_types: Annotated[
        list[str] | None,
        typer.Option(
            "--file-type", "--quant",
            help="llama.cpp file type to quantize to (repeatable; default Q4_K_M, "
            "MOSS-TTS-Nano: Q8_0).",
        ),
    ] = None,
    outtype: Annotated[
        str | None,
        typer.Option(
            help="Intermediate GGUF type: f16, bf16, or auto (f16 unless a tensor overflows it)."
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="Quantize engine: direct (one read of the checkpoint, no intermediate GGUF; "
            "ggml's quantizer, byte-identical to llama-quantize), binary (llama-quantize on an "
            "f16 GGUF), library (libllama on it), or auto (direct where it runs)."
        ),
    ] = None,
    llama_cpp: LlamaCppDir = None,
    imatrix: Annotated[
        Path | None,
        typer.Option(help="Importance matrix (llama-imatrix's .gguf or .dat) for the file types."),
    ] = None,
    audio_tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Audio tokenizer to include: a folder with its encoder/decoder .onnx, a Hub repo "
            f"id, or none. Default: the model family's ({CODECS}; builtin models: a tiny "
            "one).",
        ),
    ] = None,
    audio_tokenizer_revision: Annotated[
        str | None, typer.Option(help="Hub revision of --audio-tokenizer.")
    ] = None,
    fmt: Annotated[
        list[str] | None,
        typer.Option(
            "--format",
            help="backend (Qwen3 GGUF + .npy tables, synth speaks it; default) or "
            "moss-tts-delay (first-class GGUF for OpenMOSS's llama.cpp fork); repeatable.",
        ),
    ] = None,
    pytorch_audio_tokenizer: Annotated[
        str | None,
        typer.Option(
            help="With --format moss-tts-delay: also write the audio tokenizer as the fork's "
            "native encoder and decoder GGUFs (f16, for llama-moss-tts --audio-encoder-model/"
            "--audio-decoder-model), from this PyTorch MOSS Audio Tokenizer: a folder or a Hub "
            f"repo such as {CODEC_REPO}. Default: none (a 7.1 GB download; the folder's ONNX "
            "tokenizer already serves the fork's e2e script).",
        ),
    ] = None,
    audio_tables_type: Annotated[
        str | None,
        typer.Option(
            help="With --format moss-tts-delay: keep the 2 x n_vq audio tables in f16, bf16 or "
            "q8_0 in the quantized files (default: their base type, as llama-quantize does).",
        ),
    ] = None,
    keep_intermediate: Annotated[
        bool, typer.Option(help="Keep the extracted backbone safetensors and the f16/bf16 GGUF.")
    ] = False,
    merge_lora: Annotated[
        list[str] | None,
        typer.Option(
            "--merge-lora",
            help="A PEFT LoRA adapter to merge into the weights before quantizing, in float32 "
            "as they stream (a folder with adapter_config.json + adapter_model.safetensors, "
            "or a Hub id); ADAPTER:SCALE scales it; repeatable (stacked in order).",
        ),
    ] = None,
    force_base: Annotated[
        bool,
        typer.Option(help="Merge an adapter whose base_model_name_or_path names another "
                     "model (warned)."),
    ] = False,
    threads: Annotated[int | None, typer.Option(help="Quantize threads.")] = None,
    base_model: Annotated[
        str | None,
        typer.Option(
            help="The Hub repo a local --model folder was taken from, for the model card's "
            "base_model (default: a Hub --model itself, or the checkpoint's _name_or_path).",
        ),
    ] = None,
    push_to_hub: Annotated[
        str | None,
        typer.Option(help="When the folder is done and verified, push it to this Hub repo "
                     "(OWNER/NAME) as `moss-gguf push` does."),
    ] = None,
    revision: Revision = None,
    cache_dir: CacheDir = None,
    force: Force = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode)
    r = load_recipe(recipe) if recipe is not None else Recipe(Path("."))
    model = model or r.model
    if not model:
        raise UsageError("no model given", hint="pass --model, or --config with a recipe")
    asked = file_types or r.file_types
    settings = AllSettings(
        model=model,
        output=output,
        file_types=asked or ["Q4_K_M"],
        outtype=outtype or r.outtype or "auto",
        engine=engine or r.engine or Engine.AUTO.value,
        synth=r.synth,
        llama_cpp=llama_cpp,
        imatrix=imatrix,
        keep_intermediate=keep_intermediate,
        force=force,
        revision=revision or r.revision,
        cache_dir=cache_dir,
        audio_tokenizer=parse_flag(audio_tokenizer or r.audio_tokenizer),
        audio_tokenizer_revision=audio_tokenizer_revision or r.audio_tokenizer_revision,
        native_codec=pytorch_audio_tokenizer,
        threads=threads,
        merge_lora=list(merge_lora or []),
        force_base=force_base,
    )
    request = AllRequest(settings, fmt, audio_tables_type, default_types=not asked,
                         base_model=base_model, command=command_line())  # fmt: skip
    if push_to_hub is not None and len(parse_formats(fmt)) > 1:
        raise UsageError("--push-to-hub pushes one folder; two formats make two",
                         hint="push each with: moss-gguf push FOLDER REPO_ID")  # fmt: skip
    family = for_input(model)
    if push_to_hub is not None and not family.publishes:
        raise UsageError(f"--push-to-hub does not publish a {family.title} folder yet",
                         hint="convert it, then share the folder as it is")  # fmt: skip
    if push_to_hub is not None:
        hub_token()  # no token: said before the long work, not after it
    with progress_for(mode) as bar:
        outcome = family.convert(request, bar)
        pushed = None
        if push_to_hub is not None:
            made = outcome.result.output if outcome.result is not None else outcome.folder.output
            pushed = push(plan_push(made, push_to_hub, bar), progress=bar)
    _render(outcome, mode, quiet)
    if pushed is not None:
        where = pushed.commit_url or "nothing sent: every file is already there"
        stdout.print(f"pushed to {pushed.repo_id}: {where}", highlight=False, soft_wrap=True)


@singledispatch
def _render(outcome: AllOutcome, mode: OutputMode, quiet: bool) -> None:
    """What `all` made, as its family's result says it (one renderer a result type)."""
    result, folder = outcome.result, outcome.folder
    if result is not None:
        if not quiet:
            _summary(result, mode)
        else:
            typer.echo(str(result.config))
    if folder is not None:
        _first_class_summary(folder, mode, quiet)
    if result is not None and not result.speaks:
        # the last line, also with --quiet: the folder is complete but cannot speak yet
        stdout.print(
            "no audio tokenizer: this folder cannot speak yet; add one with: "
            f"moss-gguf layout --output {result.output} --audio-tokenizer {DEFAULT_REPO}",
            soft_wrap=True,
        )


def _summary(result: AllResult, mode: OutputMode) -> None:
    """The steps, the folder's files and what to run next."""
    steps = Table(title="moss-gguf all", title_justify="left")
    for col in ("step", "status", "time", "detail"):
        steps.add_column(col)
    for s in result.steps:
        steps.add_row(s.name, s.status, f"{s.seconds:.1f} s", s.detail)
    stdout.print(steps)
    files = Table(title=f"{result.output}", title_justify="left")
    files.add_column("file")
    files.add_column("size", justify="right")
    for name in (*[g.name for g in result.ggufs], "embeddings/", "lm_heads/", "tokenizer/"):
        size = sum(s for p, s in result.files if p == name or p.startswith(name))
        files.add_row(name, human_bytes(size))
    stdout.print(files)
    for note in result.notes:
        info(mode, f"note: {note}")
    if result.intermediate:
        info(mode, f"intermediate files kept in {result.intermediate}")
    stdout.print(f"synth config: {result.config}")
    if result.speaks:
        stdout.print(
            f'try: moss-gguf synth --config {result.config} --text "Hello" --output hello.wav'
        )


def _first_class_summary(folder: FirstClassFolder, mode: OutputMode, quiet: bool) -> None:
    """The first-class folder's GGUFs and the fork's command that loads one."""
    if quiet:
        typer.echo(str(folder.output))
        return
    files = Table(title=f"{folder.output} ({FORMAT})", title_justify="left")
    files.add_column("file")
    files.add_column("size", justify="right")
    for g in folder.ggufs:
        files.add_row(g.name, human_bytes(next(s for p, s in folder.files if p == g.name)))
    stdout.print(files)
    for note in folder.notes:
        info(mode, f"note: {note}")
    stdout.print(
        f"run it with OpenMOSS's llama.cpp fork (see {folder.output / 'README.md'}): "
        f"llama-moss-tts -m {folder.ggufs[0]} --print-delay-config",
        soft_wrap=True,
    )


@_render.register
def _folder_summary(summary: FolderSummary, mode: OutputMode, quiet: bool) -> None:
    """Any other family's folder: its parts, then its lines (verify's counts, how to speak it)."""
    if quiet:  # the folder's path alone, as for the other families: scripts read it
        typer.echo(str(summary.output))
        return
    files = Table(title=summary.title, title_justify="left")
    files.add_column("file")
    files.add_column("size", justify="right")
    for name, size in summary.parts:
        files.add_row(name, human_bytes(size))
    stdout.print(files)
    for note in summary.notes:
        info(mode, f"note: {note}")
    for line in summary.lines:
        stdout.print(line, soft_wrap=True)
