"""The FastAPI app: OpenAI's speech routes, the voices, models, health and metrics.

Routes check what a request asks for (model, voice, input, limits), hand the work to the
Scheduler and turn its result into bytes; they never call the synthesizer. Every failure is an
OpenAI error object (api_errors.ApiError); an unexpected one is a 500 whose log line has no
traceback unless MOSS_GGUF_DEBUG=1. With an API key, every route needs
`Authorization: Bearer KEY`, except the web page in front of them (ui.py).
"""

from __future__ import annotations

import hmac
import logging
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ..errors import InputError, is_debug
from ..tts import Speaker
from ..tts.codec import FRAME_SAMPLES
from ..tts.language import language_name, languages
from ..tts.prompt import SPEAKER_TAG
from . import audio
from .api_errors import ApiError
from .metrics import CONTENT_TYPE, Metrics
from .scheduler import Scheduler, SpeechJob
from .schemas import SpeechRequest, validation_error
from .settings import (
    DEFAULT_VOICE,
    MAX_INPUT_CHARS,
    MAX_UPLOAD_BYTES,
    OPENAI_MODELS,
    OPENAI_VOICES,
    ServeSettings,
)
from .streams import stream_speech, unless_gone, wants_stream
from .ui import with_page
from .voices import VoiceStore

log = logging.getLogger(__name__)


@dataclass
class Service:
    """What the routes share: one per server."""

    settings: ServeSettings
    scheduler: Scheduler
    voices: VoiceStore
    metrics: Metrics
    model_id: str  # e.g. moss-tts
    rate: int  # the model's sample rate
    created: int  # when the weights were made (for /v1/models)
    on_ready: Any = None  # called once the server accepts requests

    def speech_job(self, body: SpeechRequest) -> SpeechJob:
        """The job BODY asks for, or the ApiError of the first thing wrong with it."""
        if body.model != self.model_id and body.model not in OPENAI_MODELS:
            raise ApiError(404, f"model {body.model!r} is not served here; use {self.model_id!r} "
                           "(GET /v1/models)", param="model", code="model_not_found")  # fmt: skip
        if not body.input.strip():
            raise ApiError(400, "input is empty; send the text to speak", param="input",
                           code="empty_input")  # fmt: skip
        if len(body.input) > MAX_INPUT_CHARS:
            raise ApiError(413, f"input is {len(body.input)} characters, the limit is "
                           f"{MAX_INPUT_CHARS}; split the text into several requests",
                           param="input", code="input_too_long")  # fmt: skip
        try:
            language = language_name(body.language)
        except InputError as exc:
            raise ApiError.from_core(exc, param="language") from None
        codes, speakers = None, self.dialogue_voices(body)
        custom = body.voice_name != DEFAULT_VOICE and body.voice_name not in OPENAI_VOICES
        if custom and not speakers:
            codes = self.voices.load(body.voice_name).codes
        return SpeechJob(
            text=body.input,
            reference_codes=codes,
            instruction=body.instructions or None,
            seed=body.seed,
            max_new_tokens=body.max_new_tokens,
            sampling=body.sampling(),
            language=language,
            speakers=speakers,
        )

    def dialogue_voices(self, body: SpeechRequest) -> list[Speaker] | None:
        """MOSS-TTSD: the stored voices, one per speaker in order, each with what its clip
        says (a `voice` alone is speaker S1); None for the other models, which take `voice`."""
        variant = self.scheduler.tts.info.variant
        if variant != "MOSS-TTSD":
            if body.voices is not None:
                raise ApiError(400, f"voices (one per speaker) is for MOSS-TTSD dialogues; "
                               f"this server speaks {variant}: send one voice",
                               param="voices", code="invalid_value")  # fmt: skip
            return None
        if not SPEAKER_TAG.search(body.input):
            raise ApiError(400, "input is a MOSS-TTSD dialogue and needs speaker tags: "
                           "[S1] Hello. [S2] Hi!", param="input", code="invalid_value")  # fmt: skip
        names, param = body.voices, "voices"
        if names is None:
            if body.voice_name == DEFAULT_VOICE or body.voice_name in OPENAI_VOICES:
                return None  # a dialogue in voices of the model's choosing
            names, param = [body.voice_name], "voice"
        speakers = []
        for number, name in enumerate(names, start=1):
            voice = self.voices.load(name, param=param)
            if not voice.text:
                raise ApiError(400, f"voice {name!r} (speaker S{number}) has no transcript; "
                               "register it again with the form field text: what the clip says",
                               param=param, code="invalid_value")  # fmt: skip
            speakers.append(Speaker(text=voice.text, codes=voice.codes))
        return speakers

    def render(self, waveform, fmt: str, speed: float) -> bytes:
        return audio.encode(audio.change_speed(waveform, self.rate, speed), self.rate, fmt)


def create_app(service: Service) -> _Guard:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        service.scheduler.start()
        if service.on_ready is not None:
            service.on_ready()
        yield
        await run_in_threadpool(service.scheduler.close, 3.0)

    app = FastAPI(title="moss-gguf", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    _errors(app)
    _middleware(app, service)
    _speech_routes(app, service)
    _voice_routes(app, service)
    return _Guard(with_page(app, key_required=bool(service.settings.api_key)))


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += "; the routes are /v1/audio/speech, /v1/audio/voices, " \
                       "/v1/audio/languages, /v1/models, /health, /metrics"  # fmt: skip
        return error_response(ApiError(exc.status_code, message, code=str(exc.status_code)))

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(ApiError(500, f"unexpected {type(exc).__name__}: {exc}",
                                       code="internal_error"))  # fmt: skip


def _middleware(app: FastAPI, service: Service) -> None:
    key = service.settings.api_key

    @app.middleware("http")
    async def authorize_and_count(request: Request, call_next):
        start = time.perf_counter()
        if key and not _authorized(request.headers.get("authorization", ""), key):
            response = error_response(ApiError(
                401, "missing or wrong API key; send 'Authorization: Bearer KEY' with the "
                "key the server was started with (--api-key)", code="invalid_api_key"))  # fmt: skip
        else:
            response = await call_next(request)
        elapsed = time.perf_counter() - start
        service.metrics.observe_request(request.url.path, response.status_code, elapsed)
        return response


def _authorized(header: str, key: str) -> bool:
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())


def _speech_routes(app: FastAPI, service: Service) -> None:
    @app.post("/v1/audio/speech")
    async def speech(body: SpeechRequest, request: Request) -> Response:
        job = service.speech_job(body)
        if wants_stream(body):
            return await stream_speech(request, body, job, service.scheduler, service.rate,
                                       service.metrics.streams_abandoned)  # fmt: skip
        result = await unless_gone(request, service.scheduler.speak(job))
        data = await run_in_threadpool(
            service.render, result.waveform, body.response_format, body.speed
        )
        return Response(data, media_type=audio.MEDIA_TYPES[body.response_format])

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": service.model_id, "object": "model", "created": service.created,
                 "owned_by": "moss-gguf"}  # fmt: skip
        return {"object": "list", "data": [entry]}

    @app.get("/health")
    async def health() -> JSONResponse:
        scheduler = service.scheduler
        body = {"status": "stopping" if scheduler.closing else "ok", "model": service.model_id,
                "queue": scheduler.waiting, "busy": scheduler.busy}  # fmt: skip
        return JSONResponse(body, status_code=503 if scheduler.closing else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)


def _voice_routes(app: FastAPI, service: Service) -> None:
    frame_s = FRAME_SAMPLES / service.rate

    @app.post("/v1/audio/voices")
    async def add_voice(
        name: Annotated[str, Form()],
        file: Annotated[UploadFile, File()],
        text: Annotated[str | None, Form()] = None,
    ) -> dict[str, Any]:
        service.voices.check_name(name)
        if file.size is not None and file.size > MAX_UPLOAD_BYTES:
            raise ApiError(413, f"file is {file.size} bytes, the limit is {MAX_UPLOAD_BYTES}; "
                           "a clip of 5-20 s is plenty", param="file",
                           code="file_too_large")  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="moss-gguf-voice-") as tmp:
            clip = Path(tmp) / (Path(file.filename or "clip").name or "clip")
            clip.write_bytes(await file.read())
            try:
                codes = await service.scheduler.encode_voice(clip)
            except ApiError as exc:
                if exc.status == 400:  # the clip is what was wrong; our temporary name is not
                    exc.param = "file"
                    exc.message = exc.message.replace(str(clip), file.filename or "the file")
                raise
        voice = await run_in_threadpool(service.voices.save, name, codes, text)
        return voice.to_dict(frame_s)

    @app.get("/v1/audio/languages")
    async def list_languages() -> dict[str, Any]:
        # what `language` takes; a client fills its selector from it (auto: no tag)
        return {"object": "list", "auto": "auto", "data": [x.to_dict() for x in languages()]}

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        voices = await run_in_threadpool(service.voices.list)
        return {"object": "list", "data": [v.to_dict(frame_s) for v in voices]}

    @app.delete("/v1/audio/voices/{name}")
    async def delete_voice(name: str) -> dict[str, Any]:
        service.voices.delete(name)
        return {"object": "voice.deleted", "name": name, "deleted": True}


class _Guard:
    """The outermost ASGI layer: Starlette answers an unexpected error with our 500 and then
    re-raises it for the server to log with a traceback; here it becomes one log line."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - already answered with a 500
            log.error("unexpected %s: %s (MOSS_GGUF_DEBUG=1 shows where)", type(exc).__name__,
                      exc, exc_info=is_debug())  # fmt: skip
