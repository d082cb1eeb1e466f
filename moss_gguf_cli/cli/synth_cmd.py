"""`moss-gguf synth`: speak text with the converted weights, write a WAV (24 kHz mono; a
MOSS-TTS-Nano folder: 48 kHz stereo)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from functools import singledispatch
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..doctor import preflight
from ..errors import InputError, UsageError
from ..families import for_config
from ..nano.engine import NanoFolderConfig
from ..nano.synth import nano_synth
from ..quantize.engines import Engine
from ..tts import (
    Speaker,
    SynthConfig,
    SynthProfile,
    SynthResult,
    plan_text,
    synth_stream,
    synth_to_wav,
)
from ..tts.floor import StepFloor, step_floor
from ..tts.language import language_name
from ..tts.lora import LoraSpec
from ..tts.speech import SpeechPlan
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
    given = {k: v for k, v in locals().items() if k not in ("config", "quiet", "verbose")}
    # the family's own reading of the config (families/), then its way of speaking (by type)
    _synth(for_config(config).read_config(config), **given)


@singledispatch
def _synth(folder: Path, *, output, text, text_file, reference, reference_text, instruction,
           language, tokens, quality, sound_event, ambient_sound, max_new_tokens, min_new_tokens,
           seed, text_temperature, text_top_p, text_top_k, audio_temperature, audio_top_p,
           audio_top_k, audio_repetition_penalty, heads_backend, n_gpu_layers, n_ctx, flash_attn,
           threads, low_memory, normalize, stream, profile, dry_run, as_json, max_batch,
           runaway_retries, lora, mode) -> None:  # fmt: skip
    """A delay family's folder speaks (every option it takes, the others refused): FOLDER is
    its synth config's path, read once the options that need no file are checked."""
    if min_new_tokens is not None:
        raise UsageError("--min-new-tokens is MOSS-TTS-Nano's; the delay models stop on "
                         "their own <|im_end|>")  # fmt: skip
    language_name(language)  # a wrong language is one line now, not after minutes of loading
    settings = SynthConfig.from_yaml(folder).override(
        max_new_tokens=max_new_tokens,
        text_temperature=text_temperature,
        text_top_p=text_top_p,
        text_top_k=text_top_k,
        audio_temperature=audio_temperature,
        audio_top_p=audio_top_p,
        audio_top_k=audio_top_k,
        audio_repetition_penalty=audio_repetition_penalty,
        heads_backend=heads_backend,
        n_gpu_layers=n_gpu_layers,
        n_ctx=n_ctx,
        flash_attn=flash_attn,
        n_threads=threads,
        low_memory=low_memory or None,
        profile=profile or None,
    )
    specs = [LoraSpec.parse(t) for t in lora or []]
    settings = replace(settings, lora=tuple(replace(s, name=str(i)) for i, s in enumerate(specs)))
    described = ambient_sound is not None or sound_event is not None
    words = _read_text(text, text_file, may_be_absent=described)
    voice, speakers = _voices(reference or [], reference_text or [])
    if as_json and not dry_run:
        raise UsageError("--json goes with --dry-run")
    if max_batch < 1 or runaway_retries < 0:
        raise UsageError("--max-batch must be 1 or more and --runaway-retries 0 or more")
    if dry_run:
        _show_plan(plan_text(settings, words, voice, instruction=instruction,
                             tokens=tokens, quality=quality, language=language,
                             sound_event=sound_event, ambient_sound=ambient_sound,
                             normalize=normalize), as_json)  # fmt: skip
        return
    # the llama.cpp runtime probe (cached once per build) catches a crashing build up front
    preflight(
        needs_quantize=False,
        needs_runtime=True,
        output=output,
        needed_bytes=None,
        llama_cpp=None,
        engine=Engine.AUTO,
    )
    options = dict(reference=voice, instruction=instruction, tokens=tokens, quality=quality,
                   language=language, seed=seed, sound_event=sound_event,
                   ambient_sound=ambient_sound, normalize=normalize,
                   speakers=speakers, max_batch=max_batch, retries=runaway_retries)  # fmt: skip
    with progress_for(mode) as bar:
        result = _speak(settings, output, words, stream, bar, options)
    p = result.profile
    chunks = f" ({len(result.chunks)} chunks)" if len(result.chunks) > 1 else ""
    info(mode, f"{p.frames} frames, {p.audio_s:.2f} s of audio in {p.total_s:.1f} s{chunks}")
    _warn_cut(result)
    if settings.profile:
        # measured after the run, in the same process: the floor's bandwidth is now's
        floor = step_floor(settings)
        (stderr if result.output is None else stdout).print(_profile_table(p, floor, result))
    if result.output is not None:
        typer.echo(str(result.output))


# the options a Nano folder does not take (the delay models'), and its sampling ones
DELAY_ONLY = {"--reference-text": "reference_text", "--instruction": "instruction",
              "--language": "language", "--tokens": "tokens", "--quality": "quality",
              "--sound-event": "sound_event", "--ambient-sound": "ambient_sound",
              "--heads-backend": "heads_backend", "--n-gpu-layers": "n_gpu_layers",
              "--flash-attn": "flash_attn", "--dry-run": "dry_run", "--json": "as_json",
              "--lora": "lora"}  # fmt: skip
NANO_SAMPLING = ("max_new_tokens", "min_new_tokens", "text_temperature", "text_top_p",
                 "text_top_k", "audio_temperature", "audio_top_p", "audio_top_k",
                 "audio_repetition_penalty", "seed")  # fmt: skip


@_synth.register
def _synth_nano(folder: NanoFolderConfig, **o: Any) -> None:
    """A MOSS-TTS-Nano folder speaks: the options it takes, the delay models' refused."""
    _refuse_delay_only({flag: o[name] for flag, name in DELAY_ONLY.items()}, o["reference"])
    _speak_nano(folder, o["output"], _read_text(o["text"], o["text_file"]),
                (o["reference"] or [None])[0], {name: o[name] for name in NANO_SAMPLING},
                o["stream"], o["threads"], o["n_ctx"], o["profile"], o["mode"])  # fmt: skip


def _refuse_delay_only(given: dict, reference: list[Path] | None) -> None:
    named = [name for name, value in given.items() if value]
    if named:
        raise UsageError(f"{', '.join(named)} do(es) not apply to a MOSS-TTS-Nano folder",
                         hint="Nano takes the text, one --reference clip, the sampling options, "
                         "--seed and --min/--max-new-tokens")  # fmt: skip
    if len(reference or []) > 1:
        raise UsageError("MOSS-TTS-Nano clones one voice: give one --reference clip")


def _speak_nano(folder: NanoFolderConfig, output: Path, words: str | None, reference: Path | None,
                sampling: dict, stream: bool, threads: int | None, n_ctx: int | None,
                profile: bool, mode: OutputMode) -> None:  # fmt: skip
    """A Nano folder speaks: 48 kHz stereo, a WAV, or 16-bit PCM as it is made (--stream)."""
    settings = folder.settings.override(**sampling)
    if stream:
        sink = sys.stdout.buffer if str(output) == "-" else output
        fmt = "wav" if str(output) != "-" and output.suffix.lower() == ".wav" else "pcm"
    elif str(output) == "-":
        raise UsageError("--output - writes to stdout, which needs --stream")
    else:
        sink, fmt = output, None
    preflight(needs_quantize=False, needs_runtime=True, output=output, needed_bytes=None,
              llama_cpp=None, engine=Engine.AUTO)  # fmt: skip
    result = nano_synth(folder, sink, words or "", reference, settings, fmt, threads, n_ctx)
    p, chunks = result.profile, len(result.speech.chunks)
    rtf = p.total_s / result.seconds if result.seconds else 0.0
    more = f" ({chunks} chunks)" if chunks > 1 else ""
    info(mode, f"{p.frames} frames, {result.seconds:.2f} s of {result.sample_rate // 1000} kHz "
         f"{'stereo' if result.channels == 2 else 'mono'} audio in {p.total_s:.1f} s "
         f"(real-time factor {rtf:.2f}){more}")  # fmt: skip
    for c in result.speech.chunks:
        if c.ended == "max":
            stderr.print(f"warning: chunk {c.index + 1} of {chunks} reached --max-new-tokens "
                         f"({c.frames} frames) before the model ended it")  # fmt: skip
    if profile:
        table = Table(title="synth profile (MOSS-TTS-Nano)", show_header=True)
        table.add_column("measure")
        table.add_column("value", justify="right")
        per = 1000.0 / max(1, p.frames)
        for name, value in (("prompt rows", str(p.prompt_rows)),
                            ("prefill", f"{p.prefill_s:.3f} s"),
                            ("global / frame", f"{p.global_s * per:.2f} ms"),
                            ("local + heads + sampling / frame", f"{p.local_s * per:.2f} ms"),
                            ("codec decode / frame", f"{p.decode_s * per:.2f} ms"),
                            ("frames", f"{p.frames} ({p.frames / max(p.total_s, 1e-9):.1f}/s)"),
                            ("real-time factor", f"{rtf:.3f}")):  # fmt: skip
            table.add_row(name, value)
        (stderr if result.output is None else stdout).print(table)
    if result.output is not None:
        typer.echo(str(result.output))


def _speak(
    settings: SynthConfig, output: Path, words: str | None, stream: bool, bar, options: dict
):
    """A WAV written at the end, or (--stream) the audio written as it is made: raw 16-bit
    PCM to stdout for `--output -`, a WAV for a .wav file, raw PCM for any other name."""
    if not stream:
        if str(output) == "-":
            raise UsageError("--output - writes to stdout, which needs --stream")
        return synth_to_wav(settings, output, words, progress=bar, **options)
    if str(output) == "-":
        return synth_stream(settings, sys.stdout.buffer, words, "pcm", progress=bar, **options)
    fmt = "wav" if output.suffix.lower() == ".wav" else "pcm"
    return synth_stream(settings, output, words, fmt, progress=bar, **options)


def _voices(references: list[Path], texts: list[str]) -> tuple[Path | None, list[Speaker]]:
    """One voice to clone, or (with --reference-text) a clip and transcript per speaker."""
    if not texts:
        if len(references) > 1:
            raise UsageError(
                "several --reference clips need a --reference-text each (a MOSS-TTSD dialogue: "
                "the clip and what it says, once per speaker, in order)"
            )
        return (references[0] if references else None), []
    if len(texts) != len(references):
        raise UsageError(
            f"{len(references)} --reference and {len(texts)} --reference-text: give them in "
            "pairs, once per speaker, in order ([S1], [S2], …)"
        )
    return None, [Speaker(text=t, reference=r) for r, t in zip(references, texts, strict=True)]


def _read_text(text: str | None, text_file: Path | None, may_be_absent: bool = False) -> str | None:
    if text is None and text_file is None and may_be_absent:
        return None  # MOSS-SoundEffect: the ambient sound says what to make
    if (text is None) == (text_file is None):
        raise UsageError("give exactly one of --text and --text-file")
    if text == "-":
        return sys.stdin.read()
    if text_file is not None:
        try:
            return text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read the text file: {exc}", path=text_file) from exc
    return text or ""


def _show_plan(plan: SpeechPlan, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(plan.to_dict(), ensure_ascii=False, indent=2))
        return
    table = Table(title=f"{len(plan.chunks)} chunk(s), voice: {plan.voice}", show_header=True)
    for name in ("chunk", "chars", "est. s", "budget", "prompt rows", "language", "text"):
        table.add_column(name, justify="left" if name in ("language", "text") else "right")
    for c in plan.chunks:
        short = c.text if len(c.text) <= 60 else c.text[:28] + " … " + c.text[-28:]
        table.add_row(str(c.index + 1), str(len(c.text)), f"{c.frames / 12.5:.1f}",
                      f"{c.budget}{' (capped)' if c.capped else ''}", str(c.prompt_rows),
                      c.language or "-", short)  # fmt: skip
    stdout.print(table)


def _warn_cut(result: SynthResult) -> None:
    """Nothing cut silently: a chunk that ran away (twice) or was capped is said on stderr."""
    n = len(result.chunks)
    for c in result.chunks:
        if c.ended == "runaway":
            tries = "twice" if c.tries > 1 else "once"
            stderr.print(f"warning: chunk {c.index + 1} of {n} reached its budget of "
                         f"{c.budget} steps without ending ({tries}); its audio may be cut or "
                         "hold noise (try another --seed)")  # fmt: skip
        elif c.ended == "cut":
            stderr.print(f"warning: chunk {c.index + 1} of {n} was cut at {c.steps} steps by "
                         "--max-new-tokens / n_ctx before it ended (raise them)")  # fmt: skip


def _profile_table(
    p: SynthProfile, floor: StepFloor, result: SynthResult | None = None
) -> Table:
    table = Table(title="synth profile", show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("prompt rows", f"{p.prompt_rows}"),
        ("prefill", f"{p.prefill_s:.3f} s ({p.prefill_tokens_per_s:.0f} tokens/s)"),
        ("steps", f"{p.steps} ({p.steps_per_s:.1f} steps/s)"),
        ("  backbone / step", f"{p.per_step_ms('backbone'):.2f} ms"),
        (f"  heads ({p.heads_backend}) / step", f"{p.per_step_ms('heads'):.2f} ms"),
        ("  sampling / step", f"{p.per_step_ms('sampling'):.2f} ms"),
        ("  embeddings / step", f"{p.per_step_ms('embed'):.2f} ms"),
        ("floor / step", f"{floor.ms:.2f} ms ({floor.step_bytes / 1e6:.0f} MB at "
         f"{floor.bandwidth / 1e9:.1f} GB/s; docs/memory-floor.md)"),
        ("floor / actual", f"{floor.ms * p.steps_per_s / 1000:.2f}"),
        ("audio decode", f"{p.decode_s:.3f} s"),
        ("audio", f"{p.frames} frames, {p.audio_s:.2f} s, {p.segments} segment(s)"),
        ("ended by", "<|im_end|>" if p.stopped else "max-new-tokens / n_ctx"),
        ("real-time factor", f"{p.real_time_factor:.2f}"),
    ]
    for c in result.chunks if result is not None and len(result.chunks) > 1 else []:
        retried = ", retried" if c.tries > 1 else ""
        rows.append((f"chunk {c.index + 1}", f"{c.chars} chars, {c.frames} frames, {c.steps}/"
                     f"{c.budget} steps, {c.ended}{retried}"))  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table
