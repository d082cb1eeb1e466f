"""`/v1/text-to-speech/{voice}/stream-input`: text sent in pieces over a WebSocket, audio back
as it is made, in ElevenLabs' stream-input shape (the one voice-agent frameworks speak), for a
family whose requests take text that grows while they run (Service.text_input: Realtime).

    client → {"text": " ", …settings}        the opening message: the handshake
    client → {"text": "Hello "}, …           pieces of the text, as they are written
    client → {"text": "…", "flush": true}    (optional) this utterance ends here; more text
                                             after it is the next utterance, spoken after it
    client → {"text": ""}                    the end of the input
    server → {"audio": "<base64 pcm>", "isFinal": null, …}   as audio is made, in order
    server → {"isFinal": true}               then the server closes (1000)

Each utterance is one request of the serve core (its text fed as it comes). The audio is 16-bit
little-endian PCM at the model's rate, mono (`output_format` pcm_24000, the default; nothing
else is offered). The opening message may carry `xi_api_key` and the speech endpoint's own
fields (`seed`, `max_new_tokens`, `min_new_tokens`, `audio_temperature`, …), checked as that
endpoint checks them; ElevenLabs' `voice_settings`, `generation_config` and a piece's
`try_trigger_generation` are taken and change nothing; the speech endpoint's fields that the
socket says otherwise (`input`, `voice`, `response_format`, `stream_format`, `speed`) are
refused by name. The API key, when the server has one, is the `xi-api-key` header,
`Authorization: Bearer`, or the opening message's `xi_api_key` (sent within OPENING_S). A
client silent for `inactivity_timeout` seconds (default 20, at most 180) while its input is open
is closed with a reason and its requests stopped; so is one whose utterance passes the input
limit. Every refusal is a close with a one-line reason: 1008, 1009 (too much text), 1003 (a
binary message), 1013 (the server is full or stopping: try again later).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from ..errors import InputError, TooMuchText
from ..tts.streaming import pcm16
from .api_errors import ApiError
from .schemas import parse_speech
from .settings import MAX_INPUT_CHARS

log = logging.getLogger(__name__)

PATH = "/v1/text-to-speech/{voice}/stream-input"
DEFAULT_TIMEOUT, MOST_TIMEOUT = 20, 180
POLICY, TOO_BIG, BINARY, AGAIN = 1008, 1009, 1003, 1013  # RFC 6455 close codes
OPENING_S = 10.0  # the opening message (and the key it may carry) comes within this
ELEVENLABS_FIELDS = ("text", "xi_api_key", "voice_settings", "generation_config", "flush",
                     "try_trigger_generation")  # fmt: skip
# the speech endpoint's fields the socket's path and query say instead
SAID_OTHERWISE = ("input", "voice", "model", "model_id", "response_format", "stream_format",
                  "speed")  # fmt: skip


class Refused(Exception):
    def __init__(self, reason: str, code: int = POLICY):
        super().__init__(reason)
        self.reason, self.code = " ".join(reason.split()), code


def stream_input_route(app: FastAPI, service: Any) -> None:
    @app.websocket(PATH)
    async def stream_input(ws: WebSocket, voice: str) -> None:
        await ws.accept()
        try:
            await _converse(ws, service, voice)
        except Refused as exc:
            log.info("stream-input closed: %s", exc.reason)
            await _close(ws, exc.code, exc.reason)
        except WebSocketDisconnect:
            log.info("a stream-input client went away")


async def _converse(ws: WebSocket, service: Any, voice: str) -> None:
    timeout = _timeout(ws.query_params.get("inactivity_timeout"))
    fmt = ws.query_params.get("output_format") or f"pcm_{service.rate}"
    if fmt != f"pcm_{service.rate}":
        raise Refused(f"output_format {fmt[:40]!r} is not offered; use pcm_{service.rate}")
    if service.text_input is None:
        raise Refused(f"model {service.model_id!r} takes its text whole; use POST "
                      "/v1/audio/speech")  # fmt: skip
    key = service.settings.api_key
    header_ok = _authorized(ws, key, None)
    opening = await _message(ws, min(timeout, OPENING_S))
    if not header_ok and not _authorized(ws, key, opening.get("xi_api_key")):
        raise Refused("missing or wrong API key: send the xi-api-key header, 'Authorization: "
                      "Bearer KEY', or xi_api_key in the opening message")  # fmt: skip
    body = _opening(opening, service, voice, ws.query_params.get("model_id"))
    utterances: asyncio.Queue = asyncio.Queue()
    sender = asyncio.ensure_future(_send(ws, utterances))
    streams: list[Any] = []
    try:
        await _receive(ws, service, body, timeout, sender, utterances, streams)
        await sender
    finally:
        if not sender.done():
            sender.cancel()
        for stream in streams:
            if not stream.done:
                stream.close()  # the request stops at its next step; its engine is free again


def _opening(opening: dict[str, Any], service: Any, voice: str, model: str | None) -> Any:
    """The opening message as the speech endpoint's request (its checks, its fields)."""
    if not isinstance(opening.get("text"), str) or opening["text"].strip():
        raise Refused('the opening message is {"text": " "} (a space), with the settings')
    taken = [k for k in SAID_OTHERWISE if k in opening]
    if taken:
        raise Refused(f"{taken[0]} is not taken in the opening message: the socket's path and "
                      "query say it")  # fmt: skip
    fields = {k: v for k, v in opening.items() if k not in ELEVENLABS_FIELDS}
    try:
        body = parse_speech(json.dumps({"model": model or service.model_id, "input": " ",
                                        "voice": voice, **fields}).encode())  # fmt: skip
        service.text_input(service, body)  # the family's checks now, not at the first word
    except ApiError as exc:
        raise Refused(f"{exc.param or 'request'}: {exc.message}") from None
    if body.model != service.model_id:
        raise Refused(f"model_id {body.model[:40]!r} is not served here; use "
                      f"{service.model_id!r}")  # fmt: skip
    return body


async def _receive(ws: WebSocket, service: Any, body: Any, timeout: float,
                   sender: asyncio.Future, utterances: asyncio.Queue,
                   streams: list[Any]) -> None:  # fmt: skip
    """Pieces into the current utterance's feed until the end marker; a flush ends the
    utterance (the next piece starts another); a silent client is timed out."""
    feed = None
    while True:
        wait = asyncio.ensure_future(_message(ws, timeout))
        await asyncio.wait({wait, sender}, return_when=asyncio.FIRST_COMPLETED)
        if not wait.done():  # the sender failed: it says why
            wait.cancel()
            return
        message = wait.result()
        piece = message.get("text")
        if not isinstance(piece, str):
            raise Refused('a message is {"text": "..."}; {"text": ""} ends the input')
        if not piece:  # the end of the input
            if feed is not None:
                feed.end()
            utterances.put_nowait(None)
            return
        if feed is None and piece.strip():
            feed = _start(service, body, streams, utterances)
        try:
            if feed is not None:
                feed.push(piece)
                if message.get("flush") is True:
                    feed.end()
                    feed = None
        except InputError as exc:  # past the limit (a 1009), or text it cannot take
            raise Refused(exc.message, TOO_BIG if isinstance(exc, TooMuchText) else POLICY) \
                from None  # fmt: skip


def _start(service: Any, body: Any, streams: list[Any], utterances: asyncio.Queue) -> Any:
    """A new utterance: its request queued now (refused at once when the server cannot take
    it), its audio sent after the utterances before it."""
    try:
        job, feed = service.text_input(service, body)
        stream = service.scheduler.stream(job, asyncio.get_running_loop())
    except ApiError as exc:
        code = AGAIN if exc.status in (429, 503) else POLICY
        raise Refused(f"{exc.param or 'request'}: {exc.message}", code) from None
    streams.append(stream)
    utterances.put_nowait(stream)
    return feed


async def _send(ws: WebSocket, utterances: asyncio.Queue) -> None:
    """Each utterance's audio in order as it is made; the final message once the input
    ended and every utterance is spoken."""
    while (stream := await utterances.get()) is not None:
        try:
            async for delta in stream:
                await ws.send_json({"audio": base64.b64encode(pcm16(delta.audio)).decode(),
                                    "isFinal": None, "normalizedAlignment": None,
                                    "alignment": None})  # fmt: skip
        except ApiError as exc:
            code = AGAIN if exc.status in (429, 503) else POLICY
            raise Refused(exc.message, code) from None
    await ws.send_json({"isFinal": True})
    await _close(ws, 1000, "")


async def _message(ws: WebSocket, timeout: float) -> dict[str, Any]:
    try:
        event = await asyncio.wait_for(ws.receive(), timeout)
    except asyncio.TimeoutError:
        raise Refused(f"no message for {timeout:g} s while the input is open (send "
                      '{"text": ""} to end it)') from None
    if event["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(event.get("code", 1000))
    raw = event.get("text")
    if raw is None:
        raise Refused("a message is JSON text, not binary", BINARY)
    if len(raw) > 4 * MAX_INPUT_CHARS:
        raise Refused(f"a message is at most {4 * MAX_INPUT_CHARS} characters", TOO_BIG)
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        raise Refused("a message is a JSON object") from None
    if not isinstance(message, dict):
        raise Refused("a message is a JSON object")
    return message


def _authorized(ws: WebSocket, key: str | None, given: Any) -> bool:
    """Whether the server has no key, or a header (or GIVEN, the opening message's) holds it."""
    if not key:
        return True
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    offered = [ws.headers.get("xi-api-key"), token.strip() if scheme.lower() == "bearer" else None,
               given if isinstance(given, str) else None]  # fmt: skip
    for o in offered:
        try:
            if o and hmac.compare_digest(o.encode(), key.encode()):
                return True
        except UnicodeEncodeError:  # a lone surrogate: no key
            continue
    return False


def _timeout(value: str | None) -> float:
    if value is None:
        return float(DEFAULT_TIMEOUT)
    try:
        seconds = int(value)
    except ValueError:
        raise Refused(f"inactivity_timeout is whole seconds, 1 to {MOST_TIMEOUT}") from None
    if not 1 <= seconds <= MOST_TIMEOUT:
        raise Refused(f"inactivity_timeout is whole seconds, 1 to {MOST_TIMEOUT}")
    return float(seconds)


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    """Close with CODE and REASON (cut to the 123 bytes a close frame holds); a socket already
    gone is left as it is."""
    reason = reason.encode()[:123].decode("utf-8", "ignore")
    try:
        await ws.close(code=code, reason=reason)
    except (RuntimeError, OSError, WebSocketDisconnect):
        pass
