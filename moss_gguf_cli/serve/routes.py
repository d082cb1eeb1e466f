"""The FastAPI app: OpenAI's speech routes, the voices, models, health and metrics.

Routes check what a request asks for (model, voice, input, limits), hand the work to the
Scheduler and turn its result into bytes; they never touch the model. Every failure is an
OpenAI error object (api_errors.ApiError); an unexpected one is a 500 whose log line has no
traceback unless MOSS_GGUF_DEBUG=1. With an API key, every route under /v1 needs
`Authorization: Bearer KEY`; /health and /metrics stay open for probes and scrapers, as vLLM
and TGI leave them (docs/serve-limits.md), and so does the web page in front of them (ui.py).
Every body is bounded before it is read: its Content-Length, then the bytes as they arrive
(_Guard).
"""

from __future__ import annotations

import hmac
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..errors import is_debug
from . import audio
from .api_errors import ApiError, error_response
from .metrics import CONTENT_TYPE, Metrics
from .origins import Gate, HostPolicy
from .scheduler import Scheduler
from .schemas import SpeechRequest, parse_speech, validation_error
from .settings import (
    MAX_BODY_BYTES,
    MAX_FORM_BYTES,
    MAX_INPUT_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    MAX_UPLOAD_BYTES,
    MAX_VOICE_TEXT_CHARS,
    OPENAI_MODELS,
    ServeSettings,
)
from .stream_input import stream_input_route
from .streams import CUT, StreamCut, stream_speech, unless_gone, wants_stream
from .ui import with_page
from .voices import VoiceStore

log = logging.getLogger(__name__)


# a family's request builder: (the Service, the request body) → the job its stepper speaks,
# or the ApiError of the first field it does not take
JobFor = Callable[["Service", SpeechRequest], Any]


@dataclass
class Service:
    """What the routes share: one per server. The family's part is data (server.open_service
    gets it from the family's loader): its request builder, its output, its languages."""

    settings: ServeSettings
    scheduler: Scheduler
    voices: VoiceStore
    metrics: Metrics
    model_id: str  # e.g. moss-tts
    created: int  # when the weights were made (for /v1/models)
    job_for: JobFor  # the family's request → job (the fields it takes)
    out: Any  # output.MonoOut / StereoOut: the audio as each format's bytes
    on_ready: Any = None  # called once the server accepts requests
    # what `language` takes (GET /v1/audio/languages); None: a 404, and the page hides it
    languages: Callable[[], list[dict[str, Any]]] | None = None
    lora: tuple[str, ...] = ()  # the LoRA adapters a request may name (/v1/models lists them)
    # a family whose requests take text that grows while they run (stream_input.py): body →
    # (job, its text feed); None: the stream-input route refuses, the text comes whole
    text_input: Callable[[Any, SpeechRequest], tuple[Any, Any]] | None = None

    @property
    def rate(self) -> int:
        """The model's sample rate."""
        return self.scheduler.info.sample_rate

    @property
    def frame_s(self) -> float:
        """Seconds an audio frame holds."""
        return self.scheduler.info.frame_s

    def speech_job(self, body: SpeechRequest) -> Any:
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
        if body.instructions and len(body.instructions) > MAX_INSTRUCTIONS_CHARS:
            raise ApiError(413, f"instructions is {len(body.instructions)} characters, the "
                           f"limit is {MAX_INSTRUCTIONS_CHARS}; shorten it",
                           param="instructions", code="instructions_too_long")  # fmt: skip
        return self.job_for(self, body)

    def render(self, result, fmt: str, speed: float) -> bytes:
        return self.out.whole(result, fmt, speed)


def create_app(service: Service) -> _Guard:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        service.scheduler.start()
        if service.on_ready is not None:
            service.on_ready()
        yield
        await run_in_threadpool(service.scheduler.close, 3.0)

    # no trailing-slash redirects: Starlette builds their Location from the Host header
    app = FastAPI(title="moss-gguf", lifespan=lifespan, docs_url=None, redoc_url=None,
                  redirect_slashes=False)  # fmt: skip
    app.state.service = service
    _errors(app)
    _middleware(app, service)
    _speech_routes(app, service)
    _voice_routes(app, service)
    stream_input_route(app, service)
    policy = HostPolicy.make(service.settings.host, service.settings.allowed_hosts)
    return Gate(_Guard(with_page(app, key_required=bool(service.settings.api_key))), policy)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path[:200]}: {exc.detail}"
        if exc.status_code in (404, 405):
            message += "; the routes are POST /v1/audio/speech, GET and POST " \
                       "/v1/audio/voices, DELETE /v1/audio/voices/NAME, " \
                       "GET /v1/audio/languages, GET /v1/models, /health, /metrics"  # fmt: skip
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        return error_response(ApiError(exc.status_code, message, code=code))

    @app.exception_handler(ClientDisconnect)
    async def gone(_request: Request, _exc: ClientDisconnect) -> Response:
        # the client left mid-body, or _Guard cut its body off (and answered it): no one reads this
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, StreamCut):  # not unexpected: _Guard drops its connection
            raise exc
        log.error("unexpected %s: %s (MOSS_GGUF_DEBUG=1 shows where)", type(exc).__name__,
                  exc, exc_info=is_debug())  # fmt: skip
        return error_response(ApiError(500, "the server failed on this request; its log says "
                                       "why", code="internal_error"))  # fmt: skip


# open without the API key: orchestrators' probes and Prometheus scrapers cannot send one
OPEN_PATHS = frozenset({"/health", "/metrics"})


def _middleware(app: FastAPI, service: Service) -> None:
    key = service.settings.api_key

    @app.middleware("http")
    async def authorize_and_count(request: Request, call_next):
        start = time.perf_counter()
        if (key and request.url.path not in OPEN_PATHS
                and not _authorized(request.headers.get("authorization", ""), key)):
            response = error_response(ApiError(
                401, "missing or wrong API key; send 'Authorization: Bearer KEY' with this "
                "server's key", code="invalid_api_key"))  # fmt: skip
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
    async def speech(request: Request) -> Response:
        raw = await request.body()  # bounded by _Guard: an oversized body is a 413 first
        _json_only(request.headers.get("content-type"))
        body = parse_speech(raw)
        job = service.speech_job(body)
        if wants_stream(body):
            return await stream_speech(request, body, job, service.scheduler, service.out,
                                       service.metrics.streams_abandoned)  # fmt: skip
        result = await unless_gone(request, service.scheduler.speak(job))
        data = await run_in_threadpool(
            service.render, result, body.response_format, body.speed
        )
        return Response(data, media_type=audio.MEDIA_TYPES[body.response_format])

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": service.model_id, "object": "model", "created": service.created,
                 "owned_by": "moss-gguf",
                 "lora": sorted(service.lora)}  # fmt: skip
        return {"object": "list", "data": [entry]}

    @app.get("/health")
    async def health() -> JSONResponse:
        scheduler = service.scheduler
        status = "stopping" if scheduler.closing else "stalled" if scheduler.stalled else "ok"
        body = {"status": status, "model": service.model_id, "queue": scheduler.waiting,
                "busy": scheduler.busy, "seconds_without_progress": round(scheduler.idle_s, 1),
                "stall_timeout": scheduler.stall_s}  # fmt: skip
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)


def _json_only(content_type: str | None) -> None:
    """A speech body is JSON, said so: a form or text/plain body is what another site's page
    can send without asking (no CORS preflight), so it is refused (415)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        got = f"Content-Type is {content_type[:80]!r}" if content_type else "no Content-Type"
        raise ApiError(415, f"{got}; send the body as application/json",
                       code="unsupported_media_type")  # fmt: skip


def _voice_routes(app: FastAPI, service: Service) -> None:
    frame_s = service.frame_s

    @app.post("/v1/audio/voices")
    async def add_voice(request: Request) -> dict[str, Any]:
        # the form is parsed here, not by FastAPI, so its bounds hold while it is read
        async with _read_form(request) as form:
            name, text, upload, replace = _voice_fields(form)
            service.voices.check_new(name, replace)  # before the clip is encoded
            with tempfile.TemporaryDirectory(prefix="moss-gguf-voice-") as tmp:
                # never the client's file name: only a short plain suffix is kept from it
                clip = Path(tmp) / f"clip{_suffix(upload.filename)}"
                await run_in_threadpool(_save, upload, clip)
                await run_in_threadpool(audio.probe_clip, clip, upload.filename)
                codes = await service.scheduler.encode_voice(clip)
        voice = await run_in_threadpool(service.voices.save, name, codes, text, replace)
        return voice.to_dict(frame_s)

    languages = service.languages
    if languages is not None:  # a 404 otherwise tells the page to hide the selector
        @app.get("/v1/audio/languages")
        async def list_languages() -> dict[str, Any]:
            # what `language` takes; a client fills its selector from it (auto: no tag)
            return {"object": "list", "auto": "auto", "data": languages()}

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        voices = await run_in_threadpool(service.voices.list)
        return {"object": "list", "data": [v.to_dict(frame_s) for v in voices]}

    @app.delete("/v1/audio/voices/{name}")
    async def delete_voice(name: str) -> dict[str, Any]:
        service.voices.delete(name)
        return {"object": "voice.deleted", "name": name, "deleted": True}


@asynccontextmanager
async def _read_form(request: Request):
    """The voice form, parsed with bounds on its parts (the whole body is _Guard's)."""
    try:
        form = await request.form(max_files=1, max_fields=3,
                                  max_part_size=4 * MAX_VOICE_TEXT_CHARS)  # fmt: skip
    except HTTPException as exc:  # a malformed multipart body
        raise ApiError(400, f"the body is not a form this route reads ({exc.detail}); send "
                       "multipart/form-data with name, file and optionally text and replace",
                       code="invalid_form") from None  # fmt: skip
    try:
        yield form
    finally:
        await form.close()


def _voice_fields(form) -> tuple[str, str | None, UploadFile, bool]:
    """name, text, the uploaded file and replace of the voice form, each checked."""
    name, text, upload = form.get("name"), form.get("text"), form.get("file")
    replace = form.get("replace", "false")
    if not isinstance(replace, str) or replace.lower() not in ("true", "false"):
        raise ApiError(400, "replace is a form field, true or false", param="replace",
                       code="invalid_value")  # fmt: skip
    if not isinstance(name, str):
        raise ApiError(400, "name is required: the voice's name, a form field",
                       param="name", code="invalid_value")  # fmt: skip
    if text is not None and not isinstance(text, str):
        raise ApiError(400, "text is a form field, not a file", param="text",
                       code="invalid_value")  # fmt: skip
    if text is not None and len(text) > MAX_VOICE_TEXT_CHARS:
        raise ApiError(413, f"text is {len(text)} characters, the limit is "
                       f"{MAX_VOICE_TEXT_CHARS}", param="text", code="text_too_long")  # fmt: skip
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "file is required: the voice's audio clip, uploaded as a file",
                       param="file", code="invalid_value")  # fmt: skip
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        raise ApiError(413, f"file is {upload.size} bytes, the limit is {MAX_UPLOAD_BYTES}; "
                       "a clip of 5-20 s is plenty", param="file",
                       code="file_too_large")  # fmt: skip
    return name, text, upload, replace.lower() == "true"


def _suffix(filename: str | None) -> str:
    suffix = Path(filename or "").suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", suffix) else ""


def _save(upload: UploadFile, path: Path) -> None:
    upload.file.seek(0)
    with open(path, "wb") as out:
        shutil.copyfileobj(upload.file, out, 1 << 20)


class _Guard:
    """The outermost ASGI layer. It bounds every body before it is read (its Content-Length;
    then the bytes as they arrive, so a chunked body is cut off too), and turns an unexpected
    error into one log line (Starlette answers it with our 500, then re-raises it for the
    server to log with a traceback). A stream cut short ends here: its connection is dropped
    without a clean end (streams.StreamCut), so the client sees it incomplete."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            limit, param = _body_limit(scope)
            refused = _declared_too_large(scope, limit, param)
            if refused is not None:  # answered without reading a byte of the body
                await error_response(refused)(scope, receive, send)
                return
            capped = _Capped(scope, receive, send, limit, param)
            receive, send = capped.receive, capped.send
        try:
            await self.app(scope, receive, send)
        except StreamCut as exc:
            log.warning("a stream ended early, its connection dropped: %s", exc)
        except Exception as exc:  # noqa: BLE001 - already answered with a 500
            log.error("unexpected %s: %s (MOSS_GGUF_DEBUG=1 shows where)", type(exc).__name__,
                      exc, exc_info=is_debug())  # fmt: skip


def _body_limit(scope) -> tuple[int, str | None]:
    """The most bytes a request's body may have, and the field named when it has more."""
    if scope["method"] == "POST" and scope["path"] == "/v1/audio/voices":
        return MAX_FORM_BYTES, "file"
    return MAX_BODY_BYTES, None


def _too_large(size: int | None, limit: int, param: str | None) -> ApiError:
    what = "the upload" if param else "the body"
    got = f"is {size} bytes" if size is not None else "passed"
    fix = "a clip of 5-20 s is plenty" if param else "shorten input or instructions"
    return ApiError(413, f"{what} {got}, the limit is {limit}; {fix}", param=param,
                    code="body_too_large")  # fmt: skip


def _declared_too_large(scope, limit: int, param: str | None) -> ApiError | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                size = int(value)
            except ValueError:
                return ApiError(400, "Content-Length is not a number", code="invalid_request")
            return _too_large(size, limit, param) if size > limit else None
    return None


class _Capped:
    """The request's RECEIVE and SEND, cut off once the body passes LIMIT bytes (a chunked
    body has no Content-Length to refuse it by): the 413 is sent there, the app is told the
    client left, and whatever it answers after that is dropped."""

    def __init__(self, scope, receive, send, limit: int, param: str | None):
        self.scope, self._receive, self._send = scope, receive, send
        self.limit, self.param = limit, param
        self.seen = 0
        self.refused = False

    async def receive(self):
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit:
                self.refused = True
                response = error_response(_too_large(None, self.limit, self.param))
                await response(self.scope, self._receive, self._send)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message) -> None:
        if self.refused:
            return
        cut = self.scope.get(CUT)
        if cut is not None and message["type"] == "http.response.body" \
                and not message.get("more_body", False):  # fmt: skip
            raise cut  # not the clean end of a stream that failed: the connection is dropped
        await self._send(message)
