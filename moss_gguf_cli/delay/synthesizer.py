"""`Synthesizer`: text (+ optional reference voice) → 24 kHz waveform, with a profile.

    from moss_gguf_cli.delay import Synthesizer, SynthConfig

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import InputError, OutputError, UsageError
from ..progress import ProgressReporter, ensure
from ..tts.backbone import Backbone, BackboneSettings
from ..tts.codec import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    AudioCodec,
    loudness_normalize,
    read_reference,
)
from ..tts.lora import load_adapters
from ..tts.sampling import SAMPLING_KEYS, Sampler, SamplingParams
from ..tts.streaming import (
    Chunker,
    FrameAssembler,
    ReceptiveField,
    StreamSettings,
    WindowDecoder,
    pcm16,
    probe_receptive_field,
    wav_header,
)
from .config import ModelInfo, SynthConfig, find_model_info
from .embeddings import EmbeddingTables
from .engine import Engine, EngineSettings, Run, SynthProfile
from .heads import AudioHeads
from .language import language_name
from .normalize import normalize_text
from .pattern import generated_segments
from .prompt import Prompt, PromptFields, build_prompt, dialogue_text, load_tokenizer
from .speech import (
    RETRIES,
    ChunkReport,
    PlanLimits,
    PromptTooLong,
    Speech,
    SpeechPlan,
    plan_speech,
)
from .text_head import TextHead

log = logging.getLogger(__name__)

DEFAULT_WIDTH = 4  # synth: chunks of a long text side by side (serve: --max-batch)


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
    chunks: list[ChunkReport] = field(default_factory=list)  # how each chunk of the text went
    plan: SpeechPlan | None = None

    @property
    def runaways(self) -> list[int]:
        """The chunks (1-based) that ran away, their retry included."""
        return [c.index + 1 for c in self.chunks if c.ended == "runaway"]

    @property
    def cut(self) -> list[int]:
        """The chunks (1-based) that max_new_tokens or n_ctx cut before they ended."""
        return [c.index + 1 for c in self.chunks if c.ended == "cut"]


class Synthesizer:
    """Loads the weights once; `generate` as often as wanted. Close it (or use `with`)."""

    def __init__(self, config: SynthConfig, max_batch: int = 1,
                 settings: EngineSettings | None = None):  # fmt: skip
        """SETTINGS: how the engine steps (delay/engine.py `EngineSettings`: the batch's
        width policy, the audio heads' backend, the text head of the ids a step needs)."""
        config.check_files()
        settings = settings or EngineSettings()
        if settings.heads is None:
            settings = replace(settings, heads=config.heads_backend)
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
            backend=settings.heads,
            n_threads=config.n_threads,
            max_width=max_batch,
        )
        self.backbone: Backbone | None = None
        self.codec: AudioCodec | None = None
        self.text_head: TextHead | None = None
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
                    repack=settings.repack,
                ),
            )
            self.text_head = TextHead(config.backbone_gguf) if settings.text_head else None
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
        self.engine = Engine(self.backbone, self.embeddings, self.heads, self.info, max_batch,
                             self.text_head, settings)  # fmt: skip
        self.adapters: dict[str, object] = {}  # LoRA adapters by name (tts/lora.py)
        try:
            self.adapters = load_adapters(self.backbone, config.lora, config.lm_head_dir,
                                          self.info.n_vq, self.info.source)  # fmt: skip
            self.use_adapters({s.name: s.scale for s in config.lora})
        except BaseException:
            self.close()
            raise

    # -- LoRA adapters

    def use_adapters(self, scales: dict[str, float]) -> None:
        """From the next decode on, the adapters named (by name → scale) and no other; a
        change drops the engine's kept prefix (its KV was made under the old set). Between
        batches only: llama.cpp applies one set to every sequence of a decode."""
        unknown = sorted(set(scales) - set(self.adapters))
        if unknown:
            raise UsageError(f"no LoRA adapter named {unknown[0]!r}",
                             hint="loaded: " + (", ".join(self.adapters) or "none"))  # fmt: skip
        chosen = [(self.adapters[n], float(s)) for n, s in sorted(scales.items())]
        if self.backbone.use_adapters(chosen):
            self.engine.forget_prefix()

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
        """Speak TEXT whole: split into chunks where it is long (delay/speech.py), the chunks
        after the first side by side in the engine, in one voice; the result joined.

        Options: reference (path or array), instruction, tokens, quality, sound_event,
        ambient_sound, language, max_new_tokens (caps every chunk), seed, normalize, and
        sampling (a dict of the config's sampling keys: SAMPLING_KEYS), checked as the
        YAML's are. The result's `chunks` says how each chunk ended.
        """
        speech = self.speech(text, progress, **options)
        for _ in self.drive(speech):
            pass
        return self.speech_result(speech)

    def stream(
        self,
        text: str,
        window: StreamSettings | None = None,
        progress: ProgressReporter | None = None,
        **options: Any,
    ) -> Iterator[np.ndarray]:
        """The waveform for TEXT in chunks (float32, 24 kHz) as it is generated.

        Takes `synthesize`'s keyword options. Within a chunk of the text the pieces joined
        equal `synthesize`'s raw decode (the decoder gets the left context it needs,
        tts/streaming.py); the loudness gain is the first window's, held for the rest.
        Chunks come in order, joined as `synthesize` joins them. Afterwards `last_result`
        holds the joined waveform, codes, rows, profile and chunks.
        """
        made: list[np.ndarray] = []
        speech = self.speech(text, progress, on_audio=lambda audio, _i: made.append(audio),
                             window=window, **options)  # fmt: skip
        for _ in self.drive(speech):
            yield from made
            made.clear()
        yield from made
        self.speech_result(speech)

    def speech(self, text: str, progress: ProgressReporter | None = None,
               on_audio: Callable[[np.ndarray, int], None] | None = None,
               window: StreamSettings | None = None, retries: int = RETRIES,
               share_first: bool = False, **options: Any) -> Speech:  # fmt: skip
        """TEXT planned into chunks, ready to drive (`drive`, or the server's worker); a
        reference given as audio (a dialogue's clips) is encoded once here for every chunk.
        SHARE_FIRST: chunk 1
        may restore a beginning an earlier prompt left in the engine (a server's requests)."""
        if self.backbone is None or self.codec is None:
            raise InputError("the synthesizer is closed")
        options = dict(options)
        reference = options.pop("reference", None)
        if reference is not None and options.get("reference_codes") is None:
            options["reference_codes"] = self.encode_reference(reference)
        if options.get("speakers") and self.info.variant == "MOSS-TTSD":
            options["dialogue_voices"] = self._dialogue_voices(None, options["speakers"])
        self._sampling_config(options.get("sampling"))  # bad keys: refused before any work
        if self.info.variant == "MOSS-SoundEffect" and (text is None or not text.strip()):
            # the sound alone: planned as the text, which `prepare` makes Text None again
            text, options["ambient_sound"] = options.get("ambient_sound"), None
        plan = self.plan(text, **options)
        for key in ("max_new_tokens", "normalize"):
            options.pop(key, None)
        return Speech(self, plan, options, ensure(progress), on_audio, retries, window,
                      share_first)  # fmt: skip

    def plan(self, text: str, **options: Any) -> SpeechPlan:
        """TEXT's chunks, prompts and budgets (`synth --dry-run` shows them)."""
        assert self.backbone is not None
        codes = options.get("reference_codes")
        frames = None if codes is None else int(np.asarray(codes).shape[0])
        voices = options.get("dialogue_voices")
        if voices is not None:  # a dialogue: every chunk holds every speaker's clip
            frames = _dialogue_frames(voices, options["speakers"], self.info.n_vq)
        return _plan(self.tokenizer, self.info, self.backbone.n_ctx, self.config, text,
                     options, frames)  # fmt: skip

    def drive(self, speech: Speech) -> Iterator[None]:
        """SPEECH through this synthesizer's engine, alone: one yield per step."""
        engine = self.engine
        try:
            while not speech.done:
                for u in speech.ready(len(engine.free)):
                    engine.join(u)
                for u in engine.step():
                    speech.ended(u)
                yield
        finally:
            if speech.running:  # a failure, or a consumer that stopped early
                speech.abort(engine, speech.error or InputError("stopped"))
        if speech.error is not None:
            raise speech.error

    def speech_result(self, speech: Speech) -> SynthResult:
        """The finished SPEECH as a result, kept as `last_result`; OutputError if it made
        no audio."""
        t0 = time.perf_counter()
        waveform, segments = speech.result_audio()
        profile = speech.profile()
        if speech.on_audio is None:
            profile.decode_s += time.perf_counter() - t0
        if not segments or not waveform.size:
            raise _no_frames(profile)
        rows = [np.array(c.rows, dtype=np.int64).reshape(-1, 1 + self.info.n_vq)
                for c in speech.chunks]  # fmt: skip
        result = SynthResult(waveform=waveform, codes=segments, rows=np.concatenate(rows),
                             profile=profile, chunks=[c.report for c in speech.chunks],
                             plan=speech.plan)  # fmt: skip
        self.last_profile, self.last_result = profile, result
        return result

    def chunk_segments(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """One utterance's generated rows → its whole audio segments (T, n_vq)."""
        array = np.array(rows, dtype=np.int64).reshape(-1, 1 + self.info.n_vq)
        return _complete_frames(generated_segments(array, self.info), self.info.audio_pad_code)

    def decode_raw(
        self, segments: list[np.ndarray], context: np.ndarray | None = None
    ) -> np.ndarray:
        """The segments' audio one after the other, as decoded (no loudness change).
        CONTEXT: the audio the first segment continues (a continuation prompt's codes, as a
        TTSD dialogue's joined clips); decoded before it and cut off, as upstream trims it,
        so the first frames sound as they follow it."""
        assert self.codec is not None
        pieces = []
        for i, segment in enumerate(segments):
            if i == 0 and context is not None and context.shape[0]:
                audio = self.codec.decode(np.concatenate([context, segment]))
                pieces.append(audio[context.shape[0] * FRAME_SAMPLES :])
            else:
                pieces.append(self.codec.decode(segment))
        return np.concatenate(pieces)

    def chunker(self, window: StreamSettings | None = None,
                context: np.ndarray | None = None) -> Chunker:  # fmt: skip
        """What turns one utterance's rows into its streamed chunks (delay/speech.py);
        CONTEXT as `decode_raw`'s."""
        assert self.codec is not None
        return Chunker(
            WindowDecoder(self.codec, self.receptive_field(), window or StreamSettings(),
                          context),  # fmt: skip
            FrameAssembler(self.info.n_vq, self.info.audio_pad_code),
        )

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
        dialogue_voices: _Voices | None = None,
    ) -> Run:
        """What one utterance starts from: its prompt, step budget and sampler.

        MOSS-TTSD: TEXT is a ``[S1]… [S2]…`` dialogue and SPEAKERS a clip and transcript per
        speaker, in order (DIALOGUE_VOICES: their clips encoded already, by `speech`).
        MOSS-SoundEffect: TEXT is the sound to make (its ambient sound), unless AMBIENT_SOUND
        is given."""
        if self.backbone is None or self.codec is None:
            raise InputError("the synthesizer is closed")
        sampler_config = self._sampling_config(sampling)
        profile = SynthProfile(heads_backend=self.heads.backend)
        t_start = time.perf_counter()
        if self.info.variant == "MOSS-SoundEffect" and ambient_sound is None and not sound_event:
            text, ambient_sound = None, text  # upstream: Text None, the sound described
        voices = self._voices(text, reference, reference_codes, speakers, normalize, profile,
                              dialogue_voices)  # fmt: skip
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
        encoded: _Voices | None = None,
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
            voices = (self._dialogue_voices(text, speakers) if encoded is None
                      else replace(encoded, text=text))  # fmt: skip
        elif reference is not None or reference_codes is not None:
            if reference_codes is None:
                reference_codes = self.encode_reference(reference)
            voices = _Voices(text, [reference_codes])
        if reference is not None or (encoded is None and any(s.reference is not None
                                                             for s in speakers or [])):
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


_FIELD_KEYS = ("instruction", "tokens", "quality", "sound_event", "ambient_sound", "language")


def _plan(tokenizer, info: ModelInfo, n_ctx: int, config: SynthConfig, text: str,
          options: dict[str, Any], voice_frames: int | None) -> SpeechPlan:  # fmt: skip
    cap = options.get("max_new_tokens")
    cap = config.max_new_tokens if cap is None else int(cap)
    if cap < 1:
        raise InputError(f"max_new_tokens must be at least 1, got {cap}")
    values = {key: options.get(key) for key in _FIELD_KEYS}
    values["language"] = language_name(values["language"])  # as the prompt holds it
    fields = PromptFields(text="", **values)
    normalize = normalize_text if options.get("normalize", True) else None
    return plan_speech(tokenizer, info, text, PlanLimits(n_ctx, cap), fields, voice_frames,
                       normalize)  # fmt: skip


def plan_text(config: SynthConfig, text: str | None, reference: str | Path | None = None,
              **options: Any) -> SpeechPlan:  # fmt: skip
    """TEXT's plan (chunks, their text and language as the prompt holds them, budgets)
    without loading the backbone or the audio tokenizer: `synth --dry-run`. A REFERENCE
    is read for its length only."""
    options = dict(options)
    text, options["ambient_sound"] = _described(
        config, text, options.get("ambient_sound"), options.get("sound_event")
    )
    if not isinstance(text, str) or not text.strip():
        raise InputError("the text to speak is empty", hint="pass --text or --text-file")
    config.check_files()
    info = find_model_info(config)
    info.refuse_unsupported()
    tokenizer = load_tokenizer(config.tokenizer_dir)
    frames = None
    if reference is not None:
        samples = read_reference(Path(reference)).size
        frames = max(1, -(-samples // FRAME_SAMPLES))
    return _plan(tokenizer, info, config.n_ctx, config, text, options, frames)


def _dialogue_frames(voices: _Voices, speakers: Sequence[Speaker], n_vq: int) -> int:
    """What a dialogue's voices add to each prompt, as the frames of one reference that
    takes at least as many rows (the plan measures prompts with one): each clip as its
    speaker's reference (a delay pattern's n_vq - 1 rows more for each after the first),
    their join as the audio the answer continues, and the transcripts (a character for a
    token: a bound)."""
    clips = voices.speakers or []
    joined = 0 if voices.continuation is None else int(voices.continuation.shape[0])
    return (sum(int(c.shape[0]) for c in clips) + joined + (len(clips) - 1) * (n_vq - 1)
            + sum(len(s.text or "") for s in speakers))  # fmt: skip


def batch_width(plan: SpeechPlan, most: int) -> int:
    """How many chunks of PLAN can run side by side, at most MOST: all of them with the
    caller's voice, all but the first (which they wait for) without."""
    side_by_side = len(plan.chunks) - (plan.voice == "chunk 1")
    return max(1, min(most, side_by_side))


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


def _described(
    config: SynthConfig, text: str | None, ambient_sound: str | None, sound_event: str | None
) -> tuple[str | None, str | None]:
    """MOSS-SoundEffect given only the sound: the sound as the text to plan, which `prepare`
    turns back into Text None beside the ambient sound (upstream's prompt)."""
    if (text is None or not text.strip()) and ambient_sound and not sound_event:
        if find_model_info(config).variant == "MOSS-SoundEffect":
            return ambient_sound, None
    return text, ambient_sound


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
    max_batch: int = DEFAULT_WIDTH,
    retries: int = RETRIES,
) -> SynthResult:
    """Load, speak TEXT once and write OUTPUT (24 kHz WAV): what `moss-gguf synth` does.
    A long TEXT's chunks run up to MAX_BATCH side by side (one KV sequence each)."""
    output = Path(output)
    if output.is_dir():
        raise OutputError("the output is a folder", path=output, hint="name a .wav file")
    if not output.parent.is_dir():
        raise OutputError("the output folder does not exist", path=output.parent)
    _check_cheap(text, dict(reference=reference, language=language, speakers=speakers,
                            ambient_sound=ambient_sound, sound_event=sound_event))  # fmt: skip
    plan = plan_text(config, text, reference, instruction=instruction, tokens=tokens,
                     quality=quality, language=language, max_new_tokens=max_new_tokens,
                     sound_event=sound_event, ambient_sound=ambient_sound,
                     normalize=normalize)  # fmt: skip
    with Synthesizer(config, max_batch=batch_width(plan, max_batch)) as tts:
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
            retries=retries,
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
    max_batch: int = DEFAULT_WIDTH,
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
    plan = plan_text(config, text, **options)
    with Synthesizer(config, max_batch=batch_width(plan, max_batch)) as tts:
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
