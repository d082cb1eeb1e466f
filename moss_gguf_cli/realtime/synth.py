"""`moss-gguf synth` on a Realtime folder: load, speak once, write 24 kHz mono (a WAV at the end,
or 16-bit PCM as it is decoded with `--stream`); `--codes-out` keeps the code grid. Everything
goes to a temporary name renamed when complete; a model that stops before its first frame
writes nothing and says so."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..disk.confine import boundary, confined
from ..doctor import preflight
from ..errors import InputError, OutputError, UsageError
from ..quantize.engines import Engine
from ..tts.codec import SAMPLE_RATE, AudioCodec, read_reference
from ..tts.sampling import Sampler, SamplingParams
from ..tts.spoken import Spoken, check_codes_out, read_text, refuse_options, sink_of, write_codes
from ..tts.streaming import StreamSettings, WindowDecoder, pcm16, probe_receptive_field, wav_header
from .config import FAMILY_NAME, TITLE
from .engine import EngineSettings, RealtimeEngine
from .feed import TextFeed
from .layout import RealtimeSettings
from .prompt import PromptIds, prompt_head, text_encoder

MAX_STDIN_CHARS = 1_000_000  # text read from stdin as it arrives (a book's chapter)
# the options of `synth` a Realtime folder does not take (the delay models' text options, …)
REFUSED = {"--reference-text": "reference_text", "--instruction": "instruction",
           "--language": "language", "--tokens": "tokens", "--quality": "quality",
           "--sound-event": "sound_event", "--ambient-sound": "ambient_sound",
           "--heads-backend": "heads_backend", "--n-gpu-layers": "n_gpu_layers",
           "--flash-attn": "flash_attn", "--dry-run": "dry_run", "--json": "as_json",
           "--lora": "lora"}  # fmt: skip
# the command's option → the folder setting it overrides (the --text-* options are taken and
# change nothing: Realtime samples no text)
OVERRIDES = {"audio_temperature": "temperature", "audio_top_p": "top_p",
             "audio_top_k": "top_k", "audio_repetition_penalty": "repetition_penalty",
             "max_new_tokens": "max_new_tokens", "min_new_tokens": "min_new_tokens"}  # fmt: skip


class NoAudio(OutputError):
    """The model ended the speech before its first frame."""


@dataclass(frozen=True)
class RealtimeFolderConfig:
    """A Realtime folder's synth config, its paths confined to the folder."""

    source: Path
    backbone: Path
    depth: Path
    tokenizer: Path
    decoder: Path | None
    encoder: Path | None
    ids: PromptIds
    audio_eos: int
    lead: int
    settings: RealtimeSettings

    @classmethod
    def from_yaml(cls, path: Path) -> RealtimeFolderConfig:
        import yaml

        path = Path(path).expanduser()
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise InputError(f"cannot read the synth config ({str(exc)[:80]})", path=path) from None
        if not isinstance(data, dict) or data.get("family") != FAMILY_NAME:
            raise InputError(f"not a {TITLE} synth config", path=path)
        edge = boundary(path.parent)

        def where(key: str, optional: bool = False) -> Path | None:
            value = data.get(key)
            if value is None and optional:
                return None
            if not isinstance(value, str):
                raise InputError(f"the synth config has no {key}", path=path,
                                 hint="make the folder again with moss-gguf all")  # fmt: skip
            return confined(path.parent / value, edge)

        try:
            pad, rvq = int(data["audio_pad_token"]), int(data["rvq"])
            ids = PromptIds(rvq, pad, pad + 1, int(data["reference_audio_pad"]),
                            int(data["text_pad"]))  # fmt: skip
            fields = {f.name for f in dataclasses.fields(RealtimeSettings)}
            settings = RealtimeSettings(**{k: v for k, v in data.items() if k in fields})
            lead = int(data["text_lead"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"the synth config has a missing or bad value ({str(exc)[:60]})",
                             path=path, hint="make the folder again with moss-gguf all") from None
        return cls(path, where("backbone_gguf"), where("depth_gguf"), where("tokenizer_dir"),
                   where("audio_decoder_onnx", True), where("audio_encoder_onnx", True), ids,
                   pad + 2, lead, settings)  # fmt: skip


@dataclass
class RealtimeResult:
    output: Path | None
    frames: int
    samples: int
    seconds_taken: float
    ended: str  # "eos", "max", or "invalid" (a code outside the codebook)


@dataclass
class Ending:
    why: str | None = None


def valid_frames(frames, codes: int, ending: Ending):
    """FRAMES up to the first holding a code outside 0 .. CODES - 1 (a pad, BOS or EOS row
    picked past codebook 1): upstream's streaming decoder ends the speech there, as the codec
    has no sound for it. A None (the engine waiting for text) passes through."""
    for frame in frames:
        if frame is not None and ((frame >= codes).any() or (frame < 0).any()):
            ending.why = "invalid"
            return
        yield frame


def realtime_synth(config: RealtimeFolderConfig, output: Path | BinaryIO, text: str | TextFeed,
                   reference: Path | None, settings: RealtimeSettings, seed: int | None,
                   stream: str | None = None, threads: int | None = None,
                   n_ctx: int | None = None,
                   codes_out: Path | None = None) -> RealtimeResult:  # fmt: skip
    """Speak TEXT with the folder of CONFIG into OUTPUT (a WAV; STREAM "pcm"/"wav": as made).
    TEXT may be a TextFeed still growing (stdin as it arrives): the speech waits for it."""
    if isinstance(text, str) and not text.strip():
        raise InputError("the text to speak is empty", hint="pass --text or --text-file")
    if config.decoder is None:
        raise InputError("the folder has no audio tokenizer: it cannot speak", path=config.source,
                         hint="make it with --audio-tokenizer (the default one)")  # fmt: skip
    encode = text_encoder(config.tokenizer)
    codec = AudioCodec(config.decoder, config.encoder, n_vq=config.ids.rvq,
                       n_threads=threads or 0)  # fmt: skip
    ref_codes = None
    if reference is not None:
        if not Path(reference).is_file():
            raise InputError("reference audio not found", path=reference)
        ref_codes = codec.encode(read_reference(Path(reference)))
    engine = RealtimeEngine(config.backbone, config.depth, config.ids, config.audio_eos,
                            EngineSettings(n_ctx=n_ctx or settings.n_ctx,
                                           n_threads=threads or settings.n_threads,
                                           kv_cache_type=settings.kv_cache_type,
                                           flash_attn=settings.flash_attn))  # fmt: skip
    head = len(prompt_head(encode, config.ids, ref_codes))
    need = engine.positions(head, config.lead, settings.max_new_tokens)
    if need > (n_ctx := engine.n_ctx):  # said now, not after minutes of audio
        engine.close()
        raise InputError(f"the prompt ({head + config.lead} rows) and --max-new-tokens "
                         f"{settings.max_new_tokens} need {need:,} positions; n_ctx is "
                         f"{n_ctx:,}", path=config.source,
                         hint="lower --max-new-tokens, or raise --n-ctx")  # fmt: skip
    audio = SamplingParams(settings.temperature, settings.top_p, settings.top_k,
                           settings.repetition_penalty)  # fmt: skip
    sampler = Sampler(audio, audio, seed)
    started = time.perf_counter()
    try:
        known = encode(text) if isinstance(text, str) else text
        made = engine.frames(known, encode, sampler, lead=config.lead,
                             max_frames=settings.max_new_tokens,
                             min_frames=settings.min_new_tokens,
                             window=settings.repetition_window, reference=ref_codes)  # fmt: skip
        ending = Ending()
        frames = _waiting(valid_frames(made, config.ids.audio_pad, ending), known)
        if isinstance(output, Path):
            tmp = output.with_name(f".{output.name}.tmp")
            try:
                with open(tmp, "wb") as sink:
                    codes, samples = _write(frames, codec, sink, stream)
                tmp.replace(output)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        else:
            codes, samples = _write(frames, codec, output, stream or "pcm")
    finally:
        engine.close()
    if codes_out is not None:
        write_codes(codes_out, codes)
    ended = ending.why or ("max" if len(codes) >= settings.max_new_tokens else "eos")
    return RealtimeResult(output if isinstance(output, Path) else None, len(codes), samples,
                          time.perf_counter() - started, ended)  # fmt: skip


def _waiting(frames, text: list[int] | TextFeed):
    """FRAMES without the engine's waits for text: each is a wait on the feed."""
    for frame in frames:
        if frame is None:
            text.wait(len(text.ids), 0.05)
            continue
        yield frame


def stdin_feed(encode, stdin: BinaryIO) -> TextFeed:
    """Standard input as it arrives, pushed into a feed by a reader thread (UTF-8, decoded
    as the bytes come; the feed ends at end of file). Text past the feed's limit is not read:
    the feed's `cut` then says so (nothing cut silently)."""
    import codecs
    import os
    import threading

    feed = TextFeed(encode, MAX_STDIN_CHARS)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read() -> None:
        try:
            while data := os.read(stdin.fileno(), 4096):
                feed.push(decoder.decode(data))
            feed.push(decoder.decode(b"", final=True))
        except InputError as exc:  # more text than the feed takes
            feed.cut = exc.message
        except OSError:  # a closed stdin: the text is what came
            pass
        finally:
            feed.end()

    threading.Thread(target=read, name="stdin-text", daemon=True).start()
    return feed


def _write(frames, codec: AudioCodec, sink: BinaryIO, stream: str | None
           ) -> tuple[np.ndarray, int]:  # fmt: skip
    """Every frame's codes, and the samples written: a WAV at the end, or PCM as it is made."""
    kept: list[np.ndarray] = []
    if stream is None:
        import soundfile as sf

        kept = [f.copy() for f in frames]
        if not kept:
            raise _no_audio()
        wav = codec.decode(np.stack(kept))
        ints = np.round(np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)
        sf.write(sink, ints, SAMPLE_RATE, subtype="PCM_16", format="WAV")
        return np.stack(kept), wav.shape[0]
    decoder = WindowDecoder(codec, probe_receptive_field(codec, 1024), StreamSettings())
    samples = 0
    try:
        if stream == "wav":
            sink.write(wav_header(SAMPLE_RATE, None))
        for frame in frames:
            kept.append(frame.copy())
            piece = decoder.push(kept[-1])
            if piece is not None:
                sink.write(pcm16(piece))
                sink.flush()  # a player reading the stream hears it now
                samples += piece.shape[0]
        if not kept:
            raise _no_audio()
        piece = decoder.end_segment()
        if piece is not None:
            sink.write(pcm16(piece))
            samples += piece.shape[0]
        if stream == "wav" and sink.seekable():  # the length is known now: a plain header
            sink.seek(0)
            sink.write(wav_header(SAMPLE_RATE, 2 * samples))
    except BrokenPipeError as exc:
        raise OutputError("the reader of the stream closed it",
                          hint="keep the player open until the text is spoken") from exc
    return np.stack(kept), samples


def _no_audio() -> NoAudio:
    return NoAudio("the model stopped before its first frame: there is no audio to write",
                   hint="try another --seed, or --min-new-tokens N to mask the stop")  # fmt: skip


def synth_options(config: Path, o: dict[str, Any], progress: Any = None) -> Spoken:
    """`synth` on the Realtime folder whose synth config is CONFIG, the command's options O."""
    folder = RealtimeFolderConfig.from_yaml(config)
    refuse_options(o, REFUSED, TITLE, "Realtime takes the text, one --reference clip, the "
                   "--audio-* sampling options, --seed and --min/--max-new-tokens")  # fmt: skip
    if len(o.get("reference") or []) > 1:
        raise UsageError(f"{TITLE} clones one voice: give one --reference clip")
    live = o["text"] == "-" and o["stream"]  # stdin spoken as it arrives
    words = None if live else read_text(o["text"], o["text_file"])
    changes = {field: o[name] for name, field in OVERRIDES.items() if o.get(name) is not None}
    settings = dataclasses.replace(folder.settings, **changes)
    if settings.min_new_tokens > settings.max_new_tokens:
        raise UsageError("--min-new-tokens is more than --max-new-tokens")
    check_codes_out(o.get("codes_out"))
    sink, fmt = sink_of(o["output"], o["stream"])
    preflight(needs_quantize=False, needs_runtime=True, output=o["output"], needed_bytes=None,
              llama_cpp=None, engine=Engine.AUTO)  # fmt: skip
    reference = (o.get("reference") or [None])[0]
    text = stdin_feed(text_encoder(folder.tokenizer), sys.stdin.buffer) if live else words or ""
    result = realtime_synth(folder, sink, text, reference, settings, o.get("seed"), fmt,
                            o.get("threads"), o.get("n_ctx"), o.get("codes_out"))  # fmt: skip
    seconds = result.samples / SAMPLE_RATE
    rtf = result.seconds_taken / seconds if seconds else 0.0
    summary = (f"{result.frames} frames, {seconds:.2f} s of 24 kHz mono audio in "
               f"{result.seconds_taken:.1f} s (real-time factor {rtf:.2f})")  # fmt: skip
    cut = getattr(text, "cut", None)
    warnings = [f"standard input was read up to the limit: {cut}; the rest was not spoken"] \
        if cut else []  # fmt: skip
    warnings += {"max": [f"reached --max-new-tokens ({result.frames} frames) before the model "
                        "ended the speech"],
                "invalid": [f"frame {result.frames + 1} held a code outside the codebook; the "
                            "speech ends there, as upstream's streaming decoder ends it"],
                }.get(result.ended, [])  # fmt: skip
    return Spoken(result.output, summary, warnings, None)
