"""`serve` for MOSS-TTS-Nano: its folder loaded into the one serve core (serve/scheduler.py)
as a stepper over nano/engine.NanoEngine, and its requests built from OpenAI's fields.

Each engine speaks one request at a time (it holds one KV sequence); the server loads as many
engines as requests it speaks at once (at most one a core), and the others wait in arrival
order. The serve core's one worker thread steps every running request a frame at a time in
turn, each on its own engine with every core: a lone request has the whole machine, two share
it, and llama.cpp's OpenMP threads only ever serve one caller (threads of two callers on 2
cores made each frame wait on the kernel: a lone request 1.7x slower, measured). Each frame
asks whether the request is still wanted (the core's Watch), so a client that leaves or a
server that stops ends it within a frame. A whole answer is the streamed pieces joined: the
same engine output, the same bytes. A request is checked whole as it comes (every chunk
against n_ctx): one that could not finish is a 400 before it waits, never a frame made and
then lost. A chunk that runs to max_new_tokens though its stop was allowed is run again with
another seed, up to --runaway-retries times, in a whole answer (a stream's audio is out as it
is made, so it keeps its first try, as the delay family's head chunk does).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..serve.api_errors import ApiError
from ..serve.output import StereoOut
from ..serve.routes import Service
from ..serve.schemas import SpeechRequest
from ..serve.server import Served, open_service
from ..serve.settings import DEFAULT_VOICE, OPENAI_VOICES, ServeSettings
from ..serve.stepper import Delta, ServedModel, SpeechJob, SpeechProfile, TurnTaking, Watch
from .engine import (
    ContextTooShort,
    NanoEngine,
    NanoFolderConfig,
    NanoProfile,
    NanoRequest,
    engines_for,  # fmt: skip
)

VARIANT = "MOSS-TTS-Nano"


@dataclass
class NanoJob(SpeechJob):
    """One request, as NanoEngine.prepare takes it."""

    min_new_tokens: int | None = None  # frames before its stop is allowed


def served_profile(p: NanoProfile, chunks: int, runaways: int, rate: int) -> SpeechProfile:
    return SpeechProfile(p.prompt_rows, p.frames, p.frames, p.samples / rate, chunks,
                         p.prefill_s, p.global_s + p.local_s, runaways,
                         backbone_s=p.global_s + p.local_s)  # fmt: skip


@dataclass
class NanoServeResult:
    pieces: list[np.ndarray]  # (channels, samples) float32, as streamed
    profile: SpeechProfile
    chunks: list[Any]
    runaways: list[int]
    cut: list[int] = field(default_factory=list)

    @property
    def waveform(self) -> np.ndarray:
        return np.concatenate(self.pieces, axis=1)


def serve_nano(settings: ServeSettings) -> Served:
    """A MOSS-TTS-Nano folder (its config read now, loaded after the bind)."""
    if settings.lora:
        raise UsageError("--lora adapters are for the delay models' backbone; a MOSS-TTS-Nano "
                         "folder takes none", hint="leave --lora out")  # fmt: skip
    config = NanoFolderConfig.from_yaml(settings.config)
    return Served(Path(config.global_gguf).name, lambda: _load(settings, config))


def _load(settings: ServeSettings, config: NanoFolderConfig) -> Service:
    """--max-batch requests at once, at most one a core, each on an engine of its own with the
    cores shared out (threads beyond the cores spin against each other); 48 kHz stereo."""
    width, threads = engines_for(settings.max_batch, config.n_threads)
    engines: list[NanoEngine] = []
    try:
        for _ in range(width):
            engines.append(NanoEngine(config, n_threads=threads))
        created = int(config.global_gguf.stat().st_mtime)
    except BaseException:
        for loaded in engines:
            loaded.close()
        raise
    stepper = NanoStepper(engines, settings.runaway_retries)
    info = stepper.info
    return open_service(settings, stepper, created, model_id=VARIANT.lower(), job_for=nano_job,
                        out=StereoOut(info.sample_rate, info.channels))  # fmt: skip


class NanoStepper(TurnTaking):
    """ENGINES (each a loaded NanoEngine with its own contexts over the same mmapped weights)
    speak that many requests at once, taking turns a frame at a time."""

    def __init__(self, engines: list[NanoEngine], retries: int = 0):
        super().__init__(engines)
        self.retries = retries
        engine = engines[0]
        self.info = ServedModel(VARIANT, engine.nano.n_vq, engine.sample_rate, engine.channels,
                                engine.frame_samples)  # fmt: skip

    def prepare(self, job: NanoJob) -> NanoRequest:
        """JOB's chunks and settings, every chunk's length checked against n_ctx (tokenizing
        the text is all it costs)."""
        engine = self.engines[0]  # the engines share one folder and n_ctx
        settings = engine.config.settings.override(
            **(job.sampling or {}), max_new_tokens=job.max_new_tokens,
            min_new_tokens=job.min_new_tokens, seed=job.seed)  # fmt: skip
        try:
            return engine.prepare(job.text, job.reference_codes, settings)
        except UsageError as exc:  # min_new_tokens above the folder's max: the route can't see it
            raise ApiError(400, exc.message, param="min_new_tokens",
                           code="invalid_value") from None  # fmt: skip

    def encode_voice(self, clip: Path) -> np.ndarray:
        return self.engines[0].reference_codes(clip)  # the codec's encoder: no KV touched

    def explain(self, error: BaseException, job: Any) -> ApiError | None:
        return _context_too_short(error) if isinstance(error, ContextTooShort) else None

    def speech(self, engine: NanoEngine, request: NanoRequest, watch: Watch,
                on_audio: Callable[[Delta], None] | None,
                ) -> Generator[None, None, NanoServeResult]:  # fmt: skip
        """REQUEST spoken a frame a step; the result is the generator's return value. A
        whole answer may run a runaway chunk again; a stream's pieces are out as made."""
        speech = engine.speech(request, retries=0 if on_audio else self.retries)

        def on_frame() -> None:
            self.progressed()
            watch.frame()

        speech.on_frame = on_frame
        pieces = []
        with engine.lock:
            for piece in speech.steps():
                if piece is not None:
                    pieces.append(piece)
                    if on_audio is not None:
                        on_audio(Delta(piece, speech.current + 1, len(speech.chunks), []))
                yield
        if not speech.frames:
            raise ApiError(422, "the model stopped before its first frame, so there is no "
                           "audio; send another seed, or min_new_tokens to mask the stop",
                           param="min_new_tokens", code="no_audio")  # fmt: skip
        runaways = [c.index + 1 for c in speech.chunks if c.ended == "max"]
        profile = served_profile(speech.profile, len(speech.chunks), len(runaways),
                                      engine.sample_rate)  # fmt: skip
        return NanoServeResult(pieces, profile, speech.chunks, runaways)


def _context_too_short(exc: ContextTooShort) -> ApiError:
    """A request longer than the server's context, refused before its first frame: the field
    to change (the server's n_ctx is not the client's)."""
    where = "input" if exc.chunks == 1 else f"chunk {exc.chunk} of {exc.chunks} of input"
    fix = exc.advice(more_ctx=None, shorter="use a shorter voice") or "shorten input"
    param = "max_new_tokens" if exc.room >= 1 else "voice" if exc.reference_frames else "input"
    return ApiError(400, f"{where} needs {exc.needed:,} positions (its prompt {exc.prompt:,} + "
                    f"max_new_tokens {exc.max_new_tokens:,} - 1), this server holds "
                    f"{exc.n_ctx:,}; {fix}", param=param,
                    code="context_length_exceeded")  # fmt: skip


def nano_job(service: Service, body: SpeechRequest) -> NanoJob:
    """A MOSS-TTS-Nano request (routes.Service.job_for): the text, a stored voice or the
    model's own, sampling; the delay models' fields refused by name."""
    for name in ("instructions", "language", "voices", "lora"):
        if getattr(body, name) is not None:
            raise ApiError(400, f"{name} is not taken by MOSS-TTS-Nano; leave it out",
                           param=name, code="unsupported_value")  # fmt: skip
    custom = body.voice_name != DEFAULT_VOICE and body.voice_name not in OPENAI_VOICES
    codes = service.voices.load(body.voice_name).codes if custom else None
    if body.min_new_tokens is not None and body.max_new_tokens is not None and \
            body.min_new_tokens > body.max_new_tokens:  # fmt: skip
        raise ApiError(400, f"min_new_tokens {body.min_new_tokens} is above max_new_tokens "
                       f"{body.max_new_tokens}", param="min_new_tokens",
                       code="invalid_value")  # fmt: skip
    return NanoJob(text=body.input, reference_codes=codes, seed=body.seed,
                   max_new_tokens=body.max_new_tokens, sampling=body.sampling(),
                   min_new_tokens=body.min_new_tokens)  # fmt: skip
