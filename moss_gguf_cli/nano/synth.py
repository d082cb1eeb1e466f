"""`moss-gguf synth` on a Nano folder: load, speak once, write 48 kHz stereo (a WAV at the end,
or 16-bit PCM as it is decoded with `--stream`). Everything goes to a temporary name renamed
when complete; a model that stops before its first frame writes nothing and says so."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..doctor import preflight
from ..errors import InputError, OutputError, UsageError
from ..quantize.engines import Engine
from ..tts.spoken import (
    Spoken,
    Table,
    check_codes_out,
    read_text,
    refuse_options,
    sink_of,
    write_codes,
)
from ..tts.streaming import pcm16, wav_header
from .engine import (
    ContextTooShort,
    NanoEngine,
    NanoFolderConfig,
    NanoProfile,
    NanoSettings,
    NanoSpeech,
)


class NoAudio(OutputError):
    """The model ended the utterance before its first frame."""


@dataclass
class NanoSynthResult:
    output: Path | None
    sample_rate: int
    channels: int
    samples: int
    speech: NanoSpeech

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate

    @property
    def profile(self) -> NanoProfile:
        return self.speech.profile


def _interleaved(piece: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(piece.T)  # (samples, channels): PCM frames, channel by channel


def _context_hint(exc: ContextTooShort, config: NanoFolderConfig, n_ctx: int | None) -> str:
    """What to change when a chunk cannot fit the context: the options, or the YAML's n_ctx."""
    yaml = config.source or config.folder
    more = "raise --n-ctx" if n_ctx else f"raise n_ctx in {yaml} or pass --n-ctx"
    return exc.advice("--max-new-tokens", "--min-new-tokens", more,
                      "use a shorter --reference clip")  # fmt: skip


def _no_audio(speech: NanoSpeech) -> NoAudio:
    return NoAudio("the model stopped before its first frame: there is no audio to write",
                   hint="try another --seed, or --min-new-tokens N to mask the stop")  # fmt: skip


def nano_synth(
    config: NanoFolderConfig,
    output: Path | BinaryIO,
    text: str,
    reference: Path | None,
    settings: NanoSettings,
    stream: str | None = None,
    n_threads: int | None = None,
    n_ctx: int | None = None,
) -> NanoSynthResult:
    """Speak TEXT with the folder of CONFIG into OUTPUT: a WAV file, or (STREAM "pcm"/"wav")
    the audio written as it is decoded, to a file or an open binary stream such as stdout."""
    settings.check()
    if not text or not text.strip():
        raise InputError("the text to speak is empty", hint="pass --text or --text-file")
    if reference is not None and not Path(reference).is_file():
        raise InputError("reference audio not found", path=reference)
    if stream not in (None, "pcm", "wav"):
        raise UsageError(f"a stream is pcm or wav, not {stream!r}")
    if isinstance(output, Path) and (output.is_dir() or not output.parent.is_dir()):
        raise OutputError("not a file in an existing folder", path=output,
                          hint="name a .wav file in a folder that exists")  # fmt: skip
    engine = NanoEngine(config, n_threads=n_threads, n_ctx=n_ctx)
    try:
        codes = engine.reference_codes(Path(reference)) if reference is not None else None
        try:
            speech = engine.speak(text, codes, settings)
        except ContextTooShort as exc:  # before any frame: said in the command's words
            exc.hint = _context_hint(exc, config, n_ctx)
            raise
        if not isinstance(output, Path):
            samples = _write_stream(speech, output, stream or "pcm", engine)
            return NanoSynthResult(None, engine.sample_rate, engine.channels, samples, speech)
        tmp = output.with_name(f".{output.name}.tmp")
        try:
            with open(tmp, "wb") as sink:
                if stream is not None:
                    samples = _write_stream(speech, sink, stream, engine)
                    if stream == "wav":  # the length is known now: a plain header
                        sink.seek(0)
                        sink.write(wav_header(engine.sample_rate, 2 * samples * engine.channels,
                                              engine.channels))  # fmt: skip
                else:
                    samples = _write_whole(speech, sink, engine)
            tmp.replace(output)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return NanoSynthResult(output, engine.sample_rate, engine.channels, samples, speech)
    finally:
        engine.close()


def _write_whole(speech: NanoSpeech, sink: BinaryIO, engine: NanoEngine) -> int:
    import soundfile as sf

    pieces = list(speech)
    if not speech.frames:
        raise _no_audio(speech)
    audio = np.concatenate(pieces, axis=1)
    ints = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    sf.write(sink, _interleaved(ints), engine.sample_rate, subtype="PCM_16", format="WAV")
    return audio.shape[1]


def _write_stream(speech: NanoSpeech, sink: BinaryIO, fmt: str, engine: NanoEngine) -> int:
    samples = 0
    try:
        if fmt == "wav":
            sink.write(wav_header(engine.sample_rate, None, engine.channels))
        for piece in speech:
            sink.write(pcm16(_interleaved(piece)))
            sink.flush()  # a player reading the stream hears it now
            samples += piece.shape[1]
    except BrokenPipeError as exc:
        raise OutputError("the reader of the stream closed it",
                          hint="keep the player open until the text is spoken") from exc
    if not speech.frames:
        raise _no_audio(speech)
    return samples


# the options of `synth` a Nano folder does not take (the delay models'), and its sampling ones
REFUSED = {"--reference-text": "reference_text", "--instruction": "instruction",
           "--language": "language", "--tokens": "tokens", "--quality": "quality",
           "--sound-event": "sound_event", "--ambient-sound": "ambient_sound",
           "--heads-backend": "heads_backend", "--n-gpu-layers": "n_gpu_layers",
           "--flash-attn": "flash_attn", "--dry-run": "dry_run", "--json": "as_json",
           "--lora": "lora"}  # fmt: skip
SAMPLING = ("max_new_tokens", "min_new_tokens", "text_temperature", "text_top_p", "text_top_k",
            "audio_temperature", "audio_top_p", "audio_top_k", "audio_repetition_penalty",
            "seed")  # fmt: skip


def synth_options(config: Path, o: dict[str, Any], progress: Any = None) -> Spoken:
    """`synth` on the Nano folder whose synth config is CONFIG, the command's options O: the
    options it takes applied, the delay models' refused in one line; 48 kHz stereo, a WAV, or
    16-bit PCM as it is made (--stream)."""
    folder = NanoFolderConfig.from_yaml(config)
    refuse_options(o, REFUSED, "MOSS-TTS-Nano", "Nano takes the text, one --reference clip, "
                   "the sampling options, --seed and --min/--max-new-tokens")  # fmt: skip
    if len(o["reference"] or []) > 1:
        raise UsageError("MOSS-TTS-Nano clones one voice: give one --reference clip")
    words = read_text(o["text"], o["text_file"])
    settings = folder.settings.override(**{name: o[name] for name in SAMPLING})
    check_codes_out(o.get("codes_out"))
    sink, fmt = sink_of(o["output"], o["stream"])
    preflight(needs_quantize=False, needs_runtime=True, output=o["output"], needed_bytes=None,
              llama_cpp=None, engine=Engine.AUTO)  # fmt: skip
    reference = (o["reference"] or [None])[0]
    result = nano_synth(folder, sink, words or "", reference, settings, fmt, o["threads"],
                        o["n_ctx"])  # fmt: skip
    if o.get("codes_out") is not None:  # every chunk's frames, in order (each decoded alone)
        write_codes(o["codes_out"], np.stack([c for chunk in result.speech.chunks
                                              for c in chunk.codes]))  # fmt: skip
    p, chunks = result.profile, len(result.speech.chunks)
    rtf = p.total_s / result.seconds if result.seconds else 0.0
    more = f" ({chunks} chunks)" if chunks > 1 else ""
    summary = (f"{p.frames} frames, {result.seconds:.2f} s of {result.sample_rate // 1000} kHz "
               f"{'stereo' if result.channels == 2 else 'mono'} audio in {p.total_s:.1f} s "
               f"(real-time factor {rtf:.2f}){more}")  # fmt: skip
    warnings = [f"chunk {c.index + 1} of {chunks} reached --max-new-tokens ({c.frames} frames) "
                "before the model ended it" for c in result.speech.chunks if c.ended == "max"]
    return Spoken(result.output, summary, warnings, _profile(p, rtf) if o["profile"] else None)


def _profile(p: NanoProfile, rtf: float) -> Table:
    per = 1000.0 / max(1, p.frames)
    rows = [["prompt rows", str(p.prompt_rows)],
            ["prefill", f"{p.prefill_s:.3f} s"],
            ["global / frame", f"{p.global_s * per:.2f} ms"],
            ["local + heads + sampling / frame", f"{p.local_s * per:.2f} ms"],
            ["codec decode / frame", f"{p.decode_s * per:.2f} ms"],
            ["frames", f"{p.frames} ({p.frames / max(p.total_s, 1e-9):.1f}/s)"],
            ["real-time factor", f"{rtf:.3f}"]]  # fmt: skip
    return Table("synth profile (MOSS-TTS-Nano)", ["measure", "value"], rows)
