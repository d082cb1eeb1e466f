"""`Synthesizer`: text (+ optional reference voice) → 24 kHz waveform, with a profile.

    from moss_gguf_cli.tts import Synthesizer, SynthConfig

    with Synthesizer(SynthConfig.from_yaml("weights/moss-tts.yaml")) as tts:
        wav = tts.generate("Hello there.", seed=7)   # float32, 24 kHz
        print(tts.last_profile)

Per step: summed embeddings of the previous row → backbone (llama.cpp) → hidden
state and text logits → delay state machine (text id forced or sampled, audio heads
only when codes are sampled) → next row. Then de-delay, drop pad frames, decode
each segment with the audio tokenizer and loudness-normalise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import InputError, OutputError, UsageError
from ..progress import ProgressReporter, ensure
from .backbone import Backbone, BackboneSettings
from .codec import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    AudioCodec,
    loudness_normalize,
    read_reference,
)
from .config import SAMPLING_KEYS, ModelInfo, SynthConfig, find_model_info
from .delay import generated_segments
from .embeddings import EmbeddingTables
from .engine import Engine, Run, SynthProfile, Utterance
from .heads import AudioHeads
from .language import language_name
from .normalize import normalize_text
from .prompt import Prompt, PromptFields, build_prompt, dialogue_text, load_tokenizer
from .sampling import Sampler, SamplingParams
from .streaming import (
    Chunker,
    FrameAssembler,
    ReceptiveField,
    StreamSettings,
    WindowDecoder,
    pcm16,
    probe_receptive_field,
    wav_header,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Speaker:
    """One speaker of a MOSS-TTSD dialogue ([S1], [S2], … in order): a reference clip (a path
    or a 24 kHz array) or its codes (T, n_vq), and what the clip says."""

    text: str
    reference: str | Path | np.ndarray | None = None
    codes: np.ndarray | None = None


@dataclass(frozen=True)
class _Voices:
    """What the prompt carries of the voices: the text field, codes per speaker, and the
    audio the answer continues (a dialogue's joined clips)."""

    text: str | None
    speakers: list[np.ndarray] | None = None
    continuation: np.ndarray | None = None


@dataclass
class SynthResult:
    waveform: np.ndarray
    codes: list[np.ndarray] = field(default_factory=list)  # per segment, (T, n_vq)
    rows: np.ndarray | None = None  # every generated row (G, 1 + n_vq)
    profile: SynthProfile = field(default_factory=SynthProfile)
    output: Path | None = None  # the WAV, when written by `synth_to_wav`


class Synthesizer:
    """Loads the weights once; `generate` as often as wanted. Close it (or use `with`)."""

    def __init__(self, config: SynthConfig, max_batch: int = 1):
        config.check_files()
        self.config = config
        self.info: ModelInfo = find_model_info(config)
        self.info.refuse_unsupported()
        info = self.info
        self.tokenizer = load_tokenizer(config.tokenizer_dir)
        self.embeddings = EmbeddingTables(config.embedding_dir, info.n_vq, info.audio_rows)
        self.heads = AudioHeads(
            config.lm_head_dir,
            info.n_vq,
            info.audio_rows,
            info.audio_pad_code,
            backend=config.heads_backend,
            n_threads=config.n_threads,
        )
        self.backbone: Backbone | None = None
        self.codec: AudioCodec | None = None
        try:
            if self.heads.hidden != self.embeddings.hidden:
                raise InputError(
                    f"audio heads have hidden size {self.heads.hidden}, embeddings "
                    f"{self.embeddings.hidden}",
                    path=config.lm_head_dir,
                )
            self.codec = AudioCodec(
                config.audio_decoder_onnx,
                config.audio_encoder_onnx,
                n_vq=info.n_vq,
                use_gpu=config.use_gpu_audio,
                n_threads=config.n_threads,
            )
            self.backbone = Backbone(
                config.backbone_gguf,
                BackboneSettings(
                    n_ctx=config.n_ctx,
                    n_batch=config.n_batch,
                    n_threads=config.n_threads,
                    n_gpu_layers=config.n_gpu_layers,
                    kv_cache_type_k=config.kv_cache_type_k,
                    kv_cache_type_v=config.kv_cache_type_v,
                    flash_attn=config.flash_attn,
                    n_seq=max_batch,
                ),
            )
            if self.backbone.n_embd != self.embeddings.hidden:
                raise InputError(
                    f"the backbone's hidden size {self.backbone.n_embd} differs from the "
                    f"embedding tables' {self.embeddings.hidden}",
                    path=config.backbone_gguf,
                    hint="backbone_gguf and embedding_dir come from different models",
                )
        except BaseException:
            self.close()
            raise
        self.last_profile: SynthProfile | None = None
        self.last_result: SynthResult | None = None
        self._reach: ReceptiveField | None = None
        self.engine = Engine(self.backbone, self.embeddings, self.heads, self.info, max_batch)

    # -- lifetime

    def close(self) -> None:
        if self.backbone is not None:
            self.backbone.close()
            self.backbone = None
        if getattr(self, "heads", None) is not None:
            self.heads.close()

    def __enter__(self) -> Synthesizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- work

    def encode_reference(self, reference: str | Path | np.ndarray) -> np.ndarray:
        """A path (any soundfile format) or a 24 kHz mono array → codes (T, n_vq)."""
        assert self.codec is not None
        if isinstance(reference, (str, Path)):
            wav = read_reference(Path(reference))
        else:
            wav = loudness_normalize(np.asarray(reference, dtype=np.float32).reshape(-1))
        return self.codec.encode(wav)

    def generate(self, text: str, **options: Any) -> np.ndarray:
        """The waveform (float32, 24 kHz, loudness-normalised) for TEXT.

        Takes the same keyword options as `synthesize` (reference, instruction, seed, ...).
        """
        return self.synthesize(text, **options).waveform

    def synthesize(
        self, text: str, progress: ProgressReporter | None = None, **options: Any
    ) -> SynthResult:
        """Like `generate`, returning the codes, rows and profile too.

        Options (keywords; `prepare` lists their types): reference (a path or a 24 kHz
        array), reference_codes, instruction, tokens, quality, sound_event, ambient_sound,
        language, max_new_tokens, seed; ``normalize``: clean TEXT as the reference processor
        does (tts/normalize.py) first; ``sampling``: this call's values of the config's
        sampling keys (text_temperature, audio_top_k, ...; SAMPLING_KEYS), checked as the
        YAML's are.
        """
        run = self.prepare(text, **options)
        progress = ensure(progress)
        rows = list(self._rows(run, progress))
        return self.whole_result(run, rows, progress)

    def whole_result(
        self, run: Run, rows: list[np.ndarray], progress: ProgressReporter | None = None
    ) -> SynthResult:
        """An utterance's generated rows decoded whole (`synthesize`, serve), kept as
        `last_result`; OutputError if they hold no complete frame."""
        progress = ensure(progress)
        profile = run.profile
        rows = np.array(rows, dtype=np.int64).reshape(-1, 1 + self.info.n_vq)
        segments = _complete_frames(generated_segments(rows, self.info), self.info.audio_pad_code)
        if not segments:
            raise _no_frames(profile)
        waveform = self._decode(segments, profile, progress, run.prompt.continuation_codes)
        profile.total_s = time.perf_counter() - run.t_start
        result = SynthResult(waveform=waveform, codes=segments, rows=rows, profile=profile)
        self.last_profile, self.last_result = profile, result
        return result

    def stream(
        self,
        text: str,
        window: StreamSettings | None = None,
        progress: ProgressReporter | None = None,
        **options: Any,
    ) -> Iterator[np.ndarray]:
        """The waveform for TEXT in chunks (float32, 24 kHz) as it is generated.

        Takes `synthesize`'s keyword options. The chunks joined equal `synthesize`'s raw
        decode (the decoder gets the left context it needs, tts/streaming.py); the loudness
        gain is the one `synthesize` would use for the first window (the whole utterance is
        not known yet) and is held for the rest. Afterwards `last_result` holds the
        joined waveform, codes, rows and profile.
        """
        run = self.prepare(text, **options)
        chunker = self.chunker(window)
        for row in self._rows(run, ensure(progress)):
            yield from chunker.push(row)
        yield from chunker.finish()
        self.stream_result(run, chunker)

    def chunker(self, window: StreamSettings | None = None) -> Chunker:
        """What turns one utterance's rows into its streamed chunks (`stream`, serve)."""
        assert self.codec is not None
        return Chunker(
            WindowDecoder(self.codec, self.receptive_field(), window or StreamSettings()),
            FrameAssembler(self.info.n_vq, self.info.audio_pad_code),
        )

    def stream_result(self, run: Run, chunker: Chunker) -> SynthResult:
        """The result of a streamed utterance (after `chunker.finish()`), kept as
        `last_result`; OutputError if it made no audio."""
        profile, decoder = run.profile, chunker.decoder
        profile.frames, profile.segments = decoder.frames, len(decoder.segments)
        profile.decode_s = decoder.decode_s
        profile.total_s = time.perf_counter() - run.t_start
        if not chunker.pieces:
            raise _no_frames(profile)
        result = SynthResult(
            waveform=np.concatenate(chunker.pieces), codes=decoder.segments,
            rows=np.array(chunker.rows, dtype=np.int64), profile=profile,
        )  # fmt: skip
        self.last_profile, self.last_result = profile, result
        return result

    def receptive_field(self) -> ReceptiveField:
        """The loaded audio decoder's reach in frames (measured once, tts/streaming.py)."""
        if self._reach is None:
            assert self.codec is not None
            self._reach = probe_receptive_field(self.codec, self.info.audio_vocab_size)
            log.info("audio decoder reach: %s", self._reach)
        return self._reach

    def prepare(
        self,
        text: str,
        reference: str | Path | np.ndarray | None = None,
        instruction: str | None = None,
        tokens: int | None = None,
        quality: str | None = None,
        sound_event: str | None = None,
        ambient_sound: str | None = None,
        language: str | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        reference_codes: np.ndarray | None = None,
        normalize: bool = True,
        sampling: dict[str, float] | None = None,
        speakers: Sequence[Speaker] | None = None,
    ) -> Run:
        """What one utterance starts from: its prompt, step budget and sampler.

        MOSS-TTSD: TEXT is a ``[S1]… [S2]…`` dialogue and SPEAKERS a clip and transcript per
        speaker, in order. MOSS-SoundEffect: TEXT is the sound to make (its ambient sound),
        unless AMBIENT_SOUND is given."""
        if self.backbone is None or self.codec is None:
            raise InputError("the synthesizer is closed")
        sampler_config = self._sampling_config(sampling)
        profile = SynthProfile(heads_backend=self.heads.backend)
        t_start = time.perf_counter()
        if self.info.variant == "MOSS-SoundEffect" and ambient_sound is None and not sound_event:
            text, ambient_sound = None, text  # upstream: Text None, the sound described
        voices = self._voices(text, reference, reference_codes, speakers, normalize, profile)
        fields = PromptFields(
            text=voices.text,
            instruction=instruction,
            tokens=tokens,
            quality=quality,
            sound_event=sound_event,
            ambient_sound=ambient_sound,
            language=language_name(language),
        )
        prompt = self._prompt(fields, voices, profile)
        steps_allowed = self._steps_allowed(prompt.rows.shape[0], max_new_tokens)
        sampler = self._sampler(seed, sampler_config)
        return Run(prompt, steps_allowed, sampler, profile, t_start)

    def _voices(
        self,
        text: str | None,
        reference: str | Path | np.ndarray | None,
        reference_codes: np.ndarray | None,
        speakers: Sequence[Speaker] | None,
        normalize: bool,
        profile: SynthProfile,
    ) -> _Voices:
        """The text field and the voices' codes (clips encoded here, timed in PROFILE)."""
        ttsd = self.info.variant == "MOSS-TTSD"
        if speakers and not ttsd:
            if len(speakers) > 1 or speakers[0].text:
                raise InputError(
                    f"{self.info.variant} speaks with one voice; a clip and transcript per "
                    "speaker is for MOSS-TTSD dialogues",
                    hint="give one --reference without --reference-text",
                )
            reference, reference_codes = speakers[0].reference, speakers[0].codes
            speakers = None
        if ttsd and (reference is not None or reference_codes is not None):
            raise InputError(
                "MOSS-TTSD clones a voice from its clip and what the clip says",
                hint="give --reference-text with each --reference, once per speaker",
            )
        t0 = time.perf_counter()
        if text is not None and ttsd:
            transcripts = [s.text for s in speakers or []]
            text = dialogue_text(text, transcripts, normalize)
        if text is not None and normalize:
            text = normalize_text(text)
        voices = _Voices(text)
        if speakers:
            voices = self._dialogue_voices(text, speakers)
        elif reference is not None or reference_codes is not None:
            if reference_codes is None:
                reference_codes = self.encode_reference(reference)
            voices = _Voices(text, [reference_codes])
        if reference is not None or any(s.reference is not None for s in speakers or []):
            profile.reference_s = time.perf_counter() - t0
        return voices

    def _dialogue_voices(self, text: str | None, speakers: Sequence[Speaker]) -> _Voices:
        """A dialogue's voices as upstream's TTSD app makes them: each clip's codes as its
        speaker's reference, and the clips joined as the audio the answer continues (encoded
        whole from the joined waveforms; speakers given as codes have theirs joined)."""
        codes, waves = [], []
        for number, speaker in enumerate(speakers, start=1):
            if speaker.reference is None and speaker.codes is None:
                raise InputError(f"speaker S{number} has a transcript but no reference clip")
            if speaker.codes is not None:
                codes.append(np.asarray(speaker.codes, dtype=np.int64))
                continue
            wav = (  # raw: the encoder normalises each clip, and their join, once
                read_reference(Path(speaker.reference), loudness=False)
                if isinstance(speaker.reference, (str, Path))
                else np.asarray(speaker.reference, np.float32).reshape(-1)
            )
            waves.append(wav)
            codes.append(self.encode_reference(wav))
        if len(waves) == len(speakers):
            joined = self.encode_reference(np.concatenate(waves))
        else:
            joined = np.concatenate(codes)
        return _Voices(text, codes, joined)

    def _prompt(self, fields: PromptFields, voices: _Voices, profile: SynthProfile) -> Prompt:
        """The prompt rows, checked against n_ctx and the embedding tables."""
        prompt = build_prompt(
            self.tokenizer,
            self.info,
            fields,
            speakers=voices.speakers,
            continuation=voices.continuation,
        )
        rows_in = prompt.rows.shape[0]
        profile.prompt_rows, profile.reference_frames = rows_in, prompt.reference_frames
        assert self.backbone is not None
        if rows_in >= self.backbone.n_ctx:
            raise PromptTooLong(rows_in, self.backbone.n_ctx)
        self.embeddings.check_ids(prompt.rows)
        return prompt

    def _steps_allowed(self, rows_in: int, max_new_tokens: int | None) -> int:
        """The step budget: max_new_tokens (the config's by default), as far as n_ctx allows."""
        assert self.backbone is not None
        n_ctx = self.backbone.n_ctx
        budget = self.config.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if budget < 1:
            raise InputError(f"max_new_tokens must be at least 1, got {budget}")
        steps_allowed = min(budget, n_ctx - rows_in)
        if steps_allowed < budget:
            log.warning(
                "n_ctx %d leaves room for %d of the %d new tokens", n_ctx, steps_allowed, budget
            )
        return steps_allowed

    def _sampling_config(self, sampling: dict[str, float] | None) -> SynthConfig:
        if not sampling:
            return self.config
        other = sorted(set(sampling) - set(SAMPLING_KEYS))
        if other:
            raise UsageError(
                f"not a sampling setting: {', '.join(other)}",
                hint=f"one call may change {', '.join(SAMPLING_KEYS)}",
            )
        return self.config.override(**sampling)

    def _sampler(self, seed: int | None, cfg: SynthConfig) -> Sampler:
        return Sampler(
            SamplingParams(cfg.text_temperature, cfg.text_top_p, cfg.text_top_k),
            SamplingParams(
                cfg.audio_temperature,
                cfg.audio_top_p,
                cfg.audio_top_k,
                cfg.audio_repetition_penalty,
            ),
            seed=seed,
        )

    def _rows(self, run: Run, progress: ProgressReporter) -> Iterator[np.ndarray]:
        """One utterance alone in the engine: its rows (1 + n_vq) as they are generated."""
        made: list[np.ndarray] = []
        u = Utterance(run, progress, made.append)
        self.engine.join(u)
        try:
            while not u.finished:
                self.engine.step()
                yield from made
                made.clear()
        finally:
            self.engine.leave(u)  # a consumer that stops early frees the sequence
        if u.error is not None:
            raise u.error

    def _decode(
        self,
        segments: list[np.ndarray],
        profile: SynthProfile,
        progress: ProgressReporter,
        context: np.ndarray | None = None,
    ) -> np.ndarray:
        """The segments' audio, one after the other, loudness-normalised. CONTEXT: the audio
        the first segment continues (a continuation prompt's codes); decoded before it and cut
        off, as upstream trims it, so the first frames sound as they follow it."""
        assert self.codec is not None
        t0 = time.perf_counter()
        progress.start("decode", "decoding audio", total=len(segments), unit="segments")
        pieces = []
        for i, segment in enumerate(segments):
            if i == 0 and context is not None and context.shape[0]:
                audio = self.codec.decode(np.concatenate([context, segment]))
                pieces.append(audio[context.shape[0] * FRAME_SAMPLES :])
            else:
                pieces.append(self.codec.decode(segment))
            progress.advance("decode", 1)
        progress.finish("decode")
        waveform = loudness_normalize(np.concatenate(pieces))
        profile.decode_s = time.perf_counter() - t0
        profile.frames = int(sum(s.shape[0] for s in segments))
        profile.segments = len(segments)
        return waveform


class PromptTooLong(InputError):
    """The prompt (text, instruction, reference voice) does not fit the context (n_ctx)."""

    def __init__(self, rows: int, n_ctx: int):
        super().__init__(f"the prompt is {rows} rows but n_ctx is {n_ctx}",
                         hint="raise n_ctx in the config, or shorten the text / reference")
        self.rows, self.n_ctx = rows, n_ctx


class NoFrames(OutputError):
    """The utterance's steps held no complete audio frame (too few steps, or no audio)."""


def _no_frames(profile: SynthProfile) -> OutputError:
    return NoFrames(
        f"the model produced no complete audio frame in {profile.steps} steps",
        hint="raise --max-new-tokens or try another --seed",
    )


def _complete_frames(segments: list[np.ndarray], pad: int) -> list[np.ndarray]:
    """Frames still holding a pad code (cut off by max_new_tokens) cannot be decoded."""
    out = []
    for segment in segments:
        whole = segment[~np.any(segment == pad, axis=1)]
        if whole.shape[0] < segment.shape[0]:
            log.debug("dropped %d incomplete frame(s)", segment.shape[0] - whole.shape[0])
        if whole.shape[0]:
            out.append(whole)
    return out


def write_wav(path: Path, waveform: np.ndarray, sample_rate: int = SAMPLE_RATE) -> Path:
    """16-bit PCM WAV, written to a temporary name and renamed when complete."""
    import soundfile as sf

    path = Path(path)
    if not path.parent.is_dir():
        raise OutputError("the output folder does not exist", path=path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        clipped = np.clip(np.asarray(waveform, dtype=np.float32), -1.0, 1.0)
        sf.write(str(tmp), clipped, sample_rate, subtype="PCM_16", format="WAV")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _check_cheap(text: str | None, options: dict[str, Any]) -> None:
    """What can be refused before minutes of loading on the real model."""
    described = options.get("ambient_sound") or options.get("sound_event")
    if (not isinstance(text, str) or not text.strip()) and not described:
        raise InputError("the text to speak is empty", hint="pass --text or --text-file")
    language_name(options.get("language"))
    clips = [options.get("reference")] + [s.reference for s in options.get("speakers") or []]
    for clip in clips:
        if isinstance(clip, (str, Path)) and not Path(clip).is_file():
            raise InputError("reference audio not found", path=clip)


def synth_to_wav(
    config: SynthConfig,
    output: Path,
    text: str | None,
    reference: str | Path | None = None,
    instruction: str | None = None,
    tokens: int | None = None,
    quality: str | None = None,
    language: str | None = None,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    progress: ProgressReporter | None = None,
    sound_event: str | None = None,
    ambient_sound: str | None = None,
    normalize: bool = True,
    speakers: Sequence[Speaker] | None = None,
) -> SynthResult:
    """Load, speak TEXT once and write OUTPUT (24 kHz WAV): what `moss-gguf synth` does."""
    output = Path(output)
    if output.is_dir():
        raise OutputError("the output is a folder", path=output, hint="name a .wav file")
    if not output.parent.is_dir():
        raise OutputError("the output folder does not exist", path=output.parent)
    _check_cheap(text, dict(reference=reference, language=language, speakers=speakers,
                            ambient_sound=ambient_sound, sound_event=sound_event))  # fmt: skip
    with Synthesizer(config) as tts:
        result = tts.synthesize(
            text,
            reference=reference,
            instruction=instruction,
            tokens=tokens,
            quality=quality,
            language=language,
            max_new_tokens=max_new_tokens,
            seed=seed,
            progress=progress,
            sound_event=sound_event,
            ambient_sound=ambient_sound,
            normalize=normalize,
            speakers=speakers,
        )
        rate = tts.info.sampling_rate  # the model's (checked against the codec's on load)
    result.output = write_wav(output, result.waveform, rate)
    return result


def synth_stream(
    config: SynthConfig,
    output: Path | BinaryIO,
    text: str | None,
    fmt: str = "pcm",
    progress: ProgressReporter | None = None,
    **options: Any,
) -> SynthResult:
    """Load, speak TEXT and write its audio as it is generated (`moss-gguf synth --stream`):
    FMT "pcm" (16-bit little-endian mono) or "wav", to OUTPUT, a file (under a temporary
    name, renamed when complete, its WAV header's sizes filled in then) or an open binary
    stream such as stdout (a WAV there says its sizes are unknown). Takes `synthesize`'s
    keyword options."""
    if fmt not in ("pcm", "wav"):
        raise UsageError(f"a stream is pcm or wav, not {fmt!r}")
    _check_cheap(text, options)
    if isinstance(output, Path) and (output.is_dir() or not output.parent.is_dir()):
        raise OutputError("not a file in an existing folder", path=output)
    with Synthesizer(config) as tts:
        rate = tts.info.sampling_rate
        if not isinstance(output, Path):
            return _write_stream(tts, output, fmt, rate, text, progress, options)
        tmp = output.with_name(f".{output.name}.tmp")
        try:
            with open(tmp, "wb") as sink:
                result = _write_stream(tts, sink, fmt, rate, text, progress, options)
                if fmt == "wav":  # the length is known now: a plain WAV header
                    sink.seek(0)
                    sink.write(wav_header(rate, 2 * result.waveform.size))
            tmp.replace(output)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    result.output = output
    return result


def _write_stream(
    tts: Synthesizer,
    sink: BinaryIO,
    fmt: str,
    rate: int,
    text: str,
    progress: ProgressReporter | None,
    options: dict[str, Any],
) -> SynthResult:
    try:
        if fmt == "wav":
            sink.write(wav_header(rate))
        for chunk in tts.stream(text, progress=progress, **options):
            sink.write(pcm16(chunk))
            sink.flush()  # a player reading the stream hears it now
    except BrokenPipeError as exc:
        raise OutputError("the reader of the stream closed it", hint="keep the player open "
                          "until the text is spoken") from exc  # fmt: skip
    assert tts.last_result is not None
    return tts.last_result
