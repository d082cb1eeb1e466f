"""`moss-gguf synth`: speak text with the converted weights, write a WAV (24 kHz mono; a
MOSS-TTS-Nano folder: 48 kHz stereo)."""

from __future__ import annotations

import json
from functools import singledispatch
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..families import for_config
from ..tts.spoken import Planned, Spoken
from ..tts.spoken import Table as SpokenTable
from ._command import command
from ._options import Quiet, Verbose
from ._output import OutputMode, info, progress_for, setup_logging, stderr, stdout

EXAMPLES = """
[b]Examples[/b]

  moss-gguf synth --config weights-demo/moss-tts.yaml --text "Hello" --output demo.wav

  moss-gguf synth --config weights/moss-tts.yaml --text-file story.txt --output story.wav \\
      --reference voice.flac --language en --seed 7

  # MOSS-TTSD: a dialogue, a clip and what it says once per speaker, in order ([S1], [S2])
  moss-gguf synth --config weights-ttsd/moss-tts.yaml -o talk.wav \\
      --text "[S1] Did you hear? [S2] I did. [S1] And?" \\
      --reference alice.wav --reference-text "Hi, I'm Alice." \\
      --reference bob.wav --reference-text "And I'm Bob."

  # MOSS-SoundEffect: the text is the sound to make
  moss-gguf synth --config weights-sfx/moss-tts.yaml --text "Rain on a tin roof" -o rain.wav

  echo "Read from stdin." | moss-gguf synth --config weights/moss-tts.yaml --text - -o out.wav

  moss-gguf synth --config weights/moss-tts.yaml --text "Hi" -o hi.wav --threads 8 --profile

  # play while it speaks: raw 16-bit PCM at 24 kHz to stdout
  moss-gguf synth --config weights/moss-tts.yaml --text "Hello" --stream --output - \\
      | aplay -f S16_LE -r 24000

  # a long text: see how it is split (chunks, budgets) without loading the model
  moss-gguf synth --config weights/moss-tts.yaml --text-file book.txt --dry-run --json

  # its chunks one after another instead of side by side (less memory)
  moss-gguf synth --config weights/moss-tts.yaml --text-file book.txt -o book.wav --max-batch 1

  # MOSS-TTS-Nano (48 kHz stereo): its own voice, or a clip's
  moss-gguf synth --config weights-nano/moss-tts-nano.yaml --text "Hello" -o hi.wav
  moss-gguf synth --config weights-nano/moss-tts-nano.yaml --text-file story.txt \\
      --reference voice.wav -o story.wav --seed 7

  # MOSS-TTS-Realtime (24 kHz mono), and the codes it made
  moss-gguf synth --config weights-rt/moss-tts-realtime.yaml --text "Hello" -o hi.wav \\
      --codes-out hi-codes.npy

  # upstream's command lines work as they are (--output defaults to output.wav)
  moss-gguf synth --config configs/llama_cpp/default.yaml --text "Hello!" \\
      --audio-temp 1.5 --audio-rep-penalty 1.2

  # a fine-tuned voice: a LoRA adapter applied at run time on any file type, at half strength
  moss-gguf synth --config weights/moss-tts.yaml --text "Hei!" --lora my-lora.gguf:0.5

Flags override the YAML's values. builtin:tiny weights are random: they speak noise.
"""

FloatOpt = Annotated[float | None, typer.Option()]


@command(
    "synth",
    help="Speak TEXT with the GGUF backbone, NumPy tables and ONNX audio tokenizer "
    "named by a moss-tts.yaml (or upstream's configs/llama_cpp/*.yaml), and write a WAV.",
    epilog=EXAMPLES,
)
def synth_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="The moss-tts.yaml to use.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="WAV file to write ('-': stdout, with --stream).")
    ] = Path("output.wav"),
    text: Annotated[str | None, typer.Option(help="Text to speak; '-' reads stdin.")] = None,
    text_file: Annotated[Path | None, typer.Option(help="Read the text from a file.")] = None,
    reference: Annotated[
        list[Path] | None,
        typer.Option(
            help="Voice to clone (any audio); MOSS-TTSD: once per speaker, in order, each "
            "with --reference-text."
        ),
    ] = None,
    reference_text: Annotated[
        list[str] | None,
        typer.Option(help="What the --reference clip says (MOSS-TTSD), once per speaker."),
    ] = None,
    instruction: Annotated[str | None, typer.Option(help="Style instruction.")] = None,
    language: Annotated[
        str | None,
        typer.Option(
            help="Language name or code: English, Chinese, en, zh, yue, ja, … (auto: none; "
            "docs/text-rules.md lists them)."
        ),
    ] = None,
    tokens: Annotated[int | None, typer.Option(help="Target length in audio tokens.")] = None,
    quality: Annotated[str | None, typer.Option(help="Quality hint.")] = None,
    sound_event: Annotated[str | None, typer.Option(help="Sound event (SoundEffect).")] = None,
    ambient_sound: Annotated[
        str | None, typer.Option(help="Ambient sound (SoundEffect).")
    ] = None,
    max_new_tokens: Annotated[
        int | None,
        typer.Option("--max-new-tokens", "--max-tokens",
                     help="Most generation steps (MOSS-TTS-Nano: frames a chunk, 12.5 a second)."),
    ] = None,
    min_new_tokens: Annotated[
        int | None,
        typer.Option("--min-new-tokens",
                     help="MOSS-TTS-Nano: frames before the model may stop (random weights stop "
                     "at once)."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Same seed, same WAV.")] = None,
    text_temperature: Annotated[
        float | None, typer.Option("--text-temperature", "--text-temp", help="0 = greedy.")
    ] = None,
    text_top_p: FloatOpt = None,
    text_top_k: Annotated[int | None, typer.Option()] = None,
    audio_temperature: Annotated[
        float | None, typer.Option("--audio-temperature", "--audio-temp", help="0 = greedy.")
    ] = None,
    audio_top_p: FloatOpt = None,
    audio_top_k: Annotated[int | None, typer.Option()] = None,
    audio_repetition_penalty: Annotated[
        float | None, typer.Option("--audio-repetition-penalty", "--audio-rep-penalty")
    ] = None,
    heads_backend: Annotated[
        str | None,
        typer.Option(help="auto/ggml-f16: float16 audio heads (faster); numpy/torch: float32."),
    ] = None,
    n_gpu_layers: Annotated[int | None, typer.Option(help="-1 = all, 0 = CPU.")] = None,
    n_ctx: Annotated[int | None, typer.Option(help="Context length.")] = None,
    flash_attn: Annotated[
        str | None, typer.Option(help="auto, enabled or disabled.")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", "--n-threads", help="CPU threads (0: the physical cores)."),
    ] = None,
    low_memory: Annotated[
        bool, typer.Option("--low-memory", help="Upstream's low-memory mode (accepted).")
    ] = False,
    normalize: Annotated[
        bool,
        typer.Option(
            "--normalize/--no-normalize",
            help="Clean the text as the MOSS-TTS processor does (markdown, spaces, "
            "repeated punctuation).",
        ),
    ] = True,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Write the audio while it is generated: '--output -' sends raw 16-bit PCM "
            "(24 kHz mono) to stdout, a .wav name gets a WAV, other names raw PCM.",
        ),
    ] = False,
    codes_out: Annotated[
        Path | None,
        typer.Option("--codes-out", help="Also write the code grid the codec decodes "
                     "(frames × codebooks, int64 .npy) to this file."),
    ] = None,
    profile: Annotated[
        bool, typer.Option("--profile", help="Print where the time went, chunk by chunk.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the plan (each chunk's text and language as "
                     "the model gets them, its step budget) without loading the model."),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --dry-run: the plan as a JSON object.")
    ] = False,
    max_batch: Annotated[
        int,
        typer.Option("--max-batch", help="Chunks of a long text spoken side by side (each "
                     "holds n_ctx positions of KV cache); 1: one after another."),
    ] = 4,
    runaway_retries: Annotated[
        int,
        typer.Option(help="How often a chunk that reaches its step budget without ending "
                     "is run again with another seed (0: never)."),
    ] = 1,
    lora: Annotated[
        list[str] | None,
        typer.Option("--lora", help="A LoRA adapter GGUF (convert --format lora) that "
                     "llama.cpp applies at run time, FILE[:SCALE] (default 1); repeatable: "
                     "stacked.", show_default=False),
    ] = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode)
    given = {k: v for k, v in locals().items() if k not in ("config", "quiet", "verbose", "mode")}
    # the config's family speaks (families/): the options it takes, the others refused
    with progress_for(mode) as bar:
        outcome = for_config(config).synth(config, given, bar)
    _render(outcome, mode)


@singledispatch
def _render(spoken: Spoken, mode: OutputMode) -> None:
    info(mode, spoken.summary)
    for warning in spoken.warnings:  # nothing cut silently
        stderr.print(f"warning: {warning}")
    if spoken.profile is not None:
        (stderr if spoken.output is None else stdout).print(_table(spoken.profile))
    if spoken.output is not None:
        typer.echo(str(spoken.output))


@_render.register
def _render_plan(plan: Planned, mode: OutputMode) -> None:
    """--dry-run: the chunks as the model would get them, or --json's object."""
    if plan.as_json:
        typer.echo(json.dumps(plan.data, ensure_ascii=False, indent=2))
    else:
        stdout.print(_table(plan.table))


def _table(table: SpokenTable) -> Table:
    shown = Table(title=table.title, show_header=True)
    for name in table.columns:
        shown.add_column(name, justify="left" if name in table.left else "right")
    for row in table.rows:
        shown.add_row(*row)
    return shown
