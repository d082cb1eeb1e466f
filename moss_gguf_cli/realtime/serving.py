"""`serve` for MOSS-TTS-Realtime: its folder loaded into the one serve core (serve/scheduler.py)
as a stepper over realtime/engine.RealtimeEngine, its requests built from OpenAI's fields.

As Nano's: each engine speaks one request at a time (one KV sequence), the server loads as
many as it speaks at once (at most one a core), and the core's one worker steps every running
request a frame at a time in turn, each frame asking whether the request is still wanted. The
audio is decoded as it is made, in windows equal to the whole decode's (tts/streaming); a whole
answer is the streamed pieces joined: the same bytes. 24 kHz mono in every format.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..native.cpu_features import physical_cores
from ..serve.api_errors import ApiError
from ..serve.output import MonoOut
from ..serve.routes import Service
from ..serve.schemas import SpeechRequest
from ..serve.server import Served, open_service
from ..serve.settings import DEFAULT_VOICE, MAX_INPUT_CHARS, OPENAI_VOICES, ServeSettings
from ..serve.stepper import (
    WAITING,
    Delta,
    ServedModel,
    SpeechJob,
    SpeechProfile,
    TurnTaking,
    Watch,
)
from ..tts.codec import FRAME_SAMPLES, SAMPLE_RATE, AudioCodec, read_reference
from ..tts.sampling import Sampler, SamplingParams
from ..tts.streaming import StreamSettings, WindowDecoder, probe_receptive_field
from .config import TITLE
from .engine import EngineSettings, RealtimeEngine
from .feed import TextFeed
from .layout import RealtimeSettings
from .prompt import EmptyText, prompt_head, text_encoder
from .synth import Ending, RealtimeFolderConfig, valid_frames

WAIT_S = 0.05  # the worker's longest rest while every request waits on its client's text
# a request's sampling keys (serve/schemas SAMPLING_KEYS) → the folder setting each overrides
SAMPLING = {"audio_temperature": "temperature", "audio_top_p": "top_p", "audio_top_k": "top_k",
            "audio_repetition_penalty": "repetition_penalty"}  # fmt: skip


@dataclass
class RealtimeJob(SpeechJob):
    min_new_tokens: int | None = None  # frames before the audio EOS may end the speech
    feed: TextFeed | None = None  # the text as it arrives (the stream-input route), else `text`


@dataclass
class RealtimeRequest:
    """A job checked: the text's ids, the settings it speaks with, its voice's codes."""

    text: list[int] | TextFeed  # the whole text's ids, or text still arriving
    settings: RealtimeSettings
    seed: int | None
    reference: np.ndarray | None


@dataclass
class RealtimeServeResult:
    pieces: list[np.ndarray]  # float32 samples, as streamed
    profile: SpeechProfile
    runaways: list[int]
    cut: list[int] = dataclasses.field(default_factory=list)

    @property
    def waveform(self) -> np.ndarray:
        return np.concatenate(self.pieces) if self.pieces else np.zeros(0, np.float32)


def serve_realtime(settings: ServeSettings) -> Served:
    """A Realtime folder (its config read now, loaded after the bind)."""
    if settings.lora:
        raise UsageError(f"--lora adapters are for the delay models' backbone; a {TITLE} folder "
                         "takes none", hint="leave --lora out")  # fmt: skip
    config = RealtimeFolderConfig.from_yaml(settings.config)
    if config.decoder is None:
        raise UsageError("the folder has no audio tokenizer: it cannot speak",
                         hint="make it with --audio-tokenizer (the default one)")  # fmt: skip
    return Served(config.backbone.name, lambda: _load(settings, config))


def _load(settings: ServeSettings, config: RealtimeFolderConfig) -> Service:
    cores = physical_cores()
    width, threads = max(1, min(settings.max_batch, cores)), config.settings.n_threads or cores
    engine_settings = EngineSettings(config.settings.n_ctx, threads, config.settings.kv_cache_type,
                                     config.settings.flash_attn)  # fmt: skip
    engines: list[RealtimeEngine] = []
    try:
        for _ in range(width):
            engines.append(RealtimeEngine(config.backbone, config.depth, config.ids,
                                          config.audio_eos, engine_settings))  # fmt: skip
        codec = AudioCodec(config.decoder, config.encoder, n_vq=config.ids.rvq)
        stepper = RealtimeStepper(config, engines, codec)
    except BaseException:
        for loaded in engines:
            loaded.close()
        raise
    return open_service(settings, stepper, int(config.backbone.stat().st_mtime),
                        model_id=TITLE.lower(), job_for=realtime_job, out=MonoOut(SAMPLE_RATE),
                        text_input=partial(text_input_job, encode=stepper.encode,
                                           wake=stepper.wake))  # fmt: skip


class RealtimeStepper(TurnTaking):
    """ENGINES speak that many requests at once, taking turns a frame at a time; one CODEC
    (the worker thread's alone) decodes them all."""

    def __init__(self, config: RealtimeFolderConfig, engines: list[RealtimeEngine],
                 codec: AudioCodec):  # fmt: skip
        super().__init__(engines)
        self.config, self.codec = config, codec
        self.encode = text_encoder(config.tokenizer)
        self.info = ServedModel(TITLE, config.ids.rvq, SAMPLE_RATE, 1, FRAME_SAMPLES)
        self.reach = probe_receptive_field(codec, config.ids.audio_pad)
        self.wake = threading.Event()  # set by every feed's change: the idle worker's wake-up

    def idle(self) -> None:
        if self.wake.wait(WAIT_S):
            self.wake.clear()

    def prepare(self, job: RealtimeJob) -> RealtimeRequest:
        changes = {SAMPLING[k]: v for k, v in (job.sampling or {}).items() if k in SAMPLING}
        for name in ("max_new_tokens", "min_new_tokens"):
            if getattr(job, name) is not None:
                changes[name] = getattr(job, name)
        settings = dataclasses.replace(self.config.settings, **changes)
        if settings.min_new_tokens > settings.max_new_tokens:
            raise ApiError(400, f"min_new_tokens {settings.min_new_tokens} is above "
                           f"max_new_tokens {settings.max_new_tokens}", param="min_new_tokens",
                           code="invalid_value")  # fmt: skip
        text = job.feed if job.feed is not None else self.encode(job.text)
        if job.feed is None and not text:
            raise ApiError(400, "input is empty after tokenizing", param="input",
                           code="invalid_value")  # fmt: skip
        engine, lead = self.engines[0], self.config.lead
        head = len(prompt_head(self.encode, self.config.ids, job.reference_codes))
        need = engine.positions(head, lead, settings.max_new_tokens)
        if need > engine.n_ctx:  # refused now, not after minutes of audio
            room = engine.n_ctx - head - lead + 1
            raise ApiError(400, f"the prompt ({head + lead} rows) and max_new_tokens "
                           f"{settings.max_new_tokens} need {need:,} positions, this server "
                           f"holds {engine.n_ctx:,}; lower max_new_tokens to {max(room, 0)} or "
                           "less", param="max_new_tokens",
                           code="context_length_exceeded")  # fmt: skip
        return RealtimeRequest(text, settings, job.seed, job.reference_codes)

    def encode_voice(self, clip: Path) -> np.ndarray:
        return self.codec.encode(read_reference(Path(clip)))

    def explain(self, error: BaseException, job: Any) -> ApiError | None:
        """A text that came to nothing (a stream-input that ended before any word) is the
        client's: a 400 naming the input."""
        if isinstance(error, EmptyText):
            return ApiError(400, error.message, param="input", code="empty_input")
        return None

    def speech(self, engine: RealtimeEngine, request: RealtimeRequest, watch: Watch,
                on_audio: Callable[[Delta], None] | None,
                ) -> Generator[None, None, RealtimeServeResult]:  # fmt: skip
        s, config = request.settings, self.config
        params = SamplingParams(s.temperature, s.top_p, s.top_k, s.repetition_penalty)
        decoder = WindowDecoder(self.codec, self.reach, StreamSettings())
        started, pieces, ending = time.perf_counter(), [], Ending()
        made = engine.frames(request.text, self.encode, Sampler(params, params, request.seed),
                             lead=config.lead, max_frames=s.max_new_tokens,
                             min_frames=s.min_new_tokens, window=s.repetition_window,
                             reference=request.reference)  # fmt: skip
        n = 0

        def out(piece: np.ndarray | None) -> None:
            if piece is not None and piece.size:
                pieces.append(piece)
                if on_audio is not None:
                    on_audio(Delta(piece, 1, 1, []))

        for frame in valid_frames(made, config.ids.audio_pad, ending):
            if frame is None:  # its text has not come yet: waiting on the client is no stall
                self.progressed()
                watch.frame()
                yield WAITING
                continue
            n += 1
            self.progressed()
            watch.frame()
            out(decoder.push(frame.copy()))
            yield
        if not n:
            raise ApiError(422, "the model stopped before its first frame, so there is no "
                           "audio; send another seed, or min_new_tokens to mask the stop",
                           param="min_new_tokens", code="no_audio")  # fmt: skip
        out(decoder.end_segment())
        seconds = time.perf_counter() - started
        ran_away = n >= s.max_new_tokens and ending.why is None
        profile = SpeechProfile(0, n, n, n * FRAME_SAMPLES / SAMPLE_RATE, 1, 0.0, seconds,
                                runaways=int(ran_away), backbone_s=seconds)  # fmt: skip
        return RealtimeServeResult(pieces, profile, [1] if ran_away else [])


def realtime_job(service: Service, body: SpeechRequest) -> RealtimeJob:
    """A Realtime request (routes.Service.job_for): the text, a stored voice or the model's
    own, sampling; the delay models' fields refused by name."""
    for name in ("instructions", "language", "voices", "lora"):
        if getattr(body, name) is not None:
            raise ApiError(400, f"{name} is not taken by {TITLE}; leave it out", param=name,
                           code="unsupported_value")  # fmt: skip
    custom = body.voice_name != DEFAULT_VOICE and body.voice_name not in OPENAI_VOICES
    codes = service.voices.load(body.voice_name).codes if custom else None
    return RealtimeJob(text=body.input, reference_codes=codes, seed=body.seed,
                       max_new_tokens=body.max_new_tokens, sampling=body.sampling(),
                       min_new_tokens=body.min_new_tokens)  # fmt: skip


def text_input_job(service: Service, body: SpeechRequest, encode,
                   wake: threading.Event) -> tuple[RealtimeJob, TextFeed]:  # fmt: skip
    """A request whose text arrives while it runs (serve/stream_input.py): BODY's settings, a
    feed the route pushes the pieces into (each change wakes the idle worker)."""
    feed = TextFeed(encode, MAX_INPUT_CHARS, wake=wake)
    job = realtime_job(service, body)
    job.feed = feed
    return job, feed
