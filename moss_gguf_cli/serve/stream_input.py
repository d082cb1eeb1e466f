"""`/v1/text-to-speech/{voice}/stream-input`: text sent in pieces over a WebSocket, audio back
as it is made, in ElevenLabs' stream-input shape (the one voice-agent frameworks speak), for a
family whose requests take text that grows while they run (Service.text_input: Realtime).

    client → {"text": " ", …settings}        the opening message: the handshake
    client → {"text": "Hello "}, …           pieces of the text, as they are written
    client → {"text": ""}                    the end of the input
    server → {"audio": "<base64 pcm>", "isFinal": null, …}   as audio is made
    server → {"isFinal": true}               then the server closes (1000)

The audio is 16-bit little-endian PCM at the model's rate, mono (`output_format` pcm_24000, the
default; nothing else is offered). The opening message may carry `xi_api_key` and the speech
endpoint's own fields (`seed`, `max_new_tokens`, `min_new_tokens`, `audio_temperature`, …),
checked as that endpoint checks them; ElevenLabs' `voice_settings`, `generation_config`
and a piece's `flush` / `try_trigger_generation` are taken and change nothing. The API key,
when the server has one, is the `xi-api-key` header, `Authorization: Bearer`, or the opening
message's `xi_api_key`. A client silent for `inactivity_timeout` seconds (default 20, at
most 180) while its input is open is closed with a reason and its request stopped; so is one
whose text passes the input limit. Every refusal is a close with code 1008 (1009: too much
text) and a one-line reason.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from ..errors import InputError
from ..tts.streaming import pcm16
from .api_errors import ApiError
from .schemas import parse_speech
from .settings import MAX_INPUT_CHARS

log = logging.getLogger(__name__)

PATH = "/v1/text-to-speech/{voice}/stream-input"
DEFAULT_TIMEOUT, MOST_TIMEOUT = 20, 180
POLICY, TOO_BIG = 1008, 1009  # RFC 6455 close codes
ELEVENLABS_FIELDS = ("text", "xi_api_key", "voice_settings", "generation_config", "flush",
                     "try_trigger_generation", "model_id")  # fmt: skip


class Refused(Exception):
    def __init__(self, reason: str, code: int = POLICY):
        super().__init__(reason)
        self.reason, self.code = " ".join(reason.split())[:120], code


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
    opening = await _message(ws, timeout)
    _authorize(ws, service.settings.api_key, opening.get("xi_api_key"))
    if not isinstance(opening.get("text"), str) or opening["text"].strip():
        raise Refused('the opening message is {"text": " "} (a space), with the settings')
    fields = {k: v for k, v in opening.items() if k not in ELEVENLABS_FIELDS}
    model = ws.query_params.get("model_id") or service.model_id
    try:
        body = parse_speech(json.dumps({"model": model, "input": " ", "voice": voice,
                                        **fields}).encode())  # fmt: skip
        if body.model != service.model_id:
            raise ApiError(404, f"model {body.model!r} is not served here; use "
                           f"{service.model_id!r}", param="model")  # fmt: skip
        job, feed = service.text_input(service, body)
        stream = service.scheduler.stream(job, asyncio.get_running_loop())
    except ApiError as exc:
        raise Refused(f"{exc.param or 'request'}: {exc.message}") from None
    sender = asyncio.ensure_future(_send(ws, stream))
    try:
        await _receive(ws, feed, timeout, sender)
        await sender
    finally:
        if not sender.done():
            sender.cancel()
        if not stream.done:
            stream.close()  # the request stops at its next step; its engine is free again


async def _receive(ws: WebSocket, feed: Any, timeout: float, sender: asyncio.Future) -> None:
    """Pieces into FEED until the end marker; a silent client is timed out."""
    while not feed.ended:
        wait = asyncio.ensure_future(_message(ws, timeout))
        await asyncio.wait({wait, sender}, return_when=asyncio.FIRST_COMPLETED)
        if not wait.done():  # the speech ended (or failed) before the input did
            wait.cancel()
            return
        piece = wait.result().get("text")
        if not isinstance(piece, str):
            raise Refused('a message is {"text": "..."}; {"text": ""} ends the input')
        try:
            if piece:
                feed.push(piece)
            else:
                feed.end()
        except InputError as exc:
            raise Refused(exc.message, TOO_BIG) from None


async def _send(ws: WebSocket, stream: Any) -> None:
    try:
        async for delta in stream:
            await ws.send_json({"audio": base64.b64encode(pcm16(delta.audio)).decode(),
                                "isFinal": None, "normalizedAlignment": None,
                                "alignment": None})  # fmt: skip
    except ApiError as exc:
        raise Refused(exc.message) from None
    await ws.send_json({"isFinal": True})
    await _close(ws, 1000, "")


async def _message(ws: WebSocket, timeout: float) -> dict[str, Any]:
    try:
        raw = await asyncio.wait_for(ws.receive_text(), timeout)
    except asyncio.TimeoutError:
        raise Refused(f"no message for {timeout:g} s while the input is open (send "
                      '{"text": ""} to end it)') from None
    if len(raw) > 4 * MAX_INPUT_CHARS:
        raise Refused(f"a message is at most {4 * MAX_INPUT_CHARS} bytes", TOO_BIG)
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        raise Refused("a message is a JSON object") from None
    if not isinstance(message, dict):
        raise Refused("a message is a JSON object")
    return message


def _authorize(ws: WebSocket, key: str | None, given: Any) -> None:
    if not key:
        return
    bearer = ws.headers.get("authorization", "")
    scheme, _, token = bearer.partition(" ")
    offered = [ws.headers.get("xi-api-key"), token.strip() if scheme.lower() == "bearer" else None,
               given if isinstance(given, str) else None]  # fmt: skip
    if not any(o and hmac.compare_digest(o.encode(), key.encode()) for o in offered):
        raise Refused("missing or wrong API key: send the xi-api-key header, 'Authorization: "
                      "Bearer KEY', or xi_api_key in the opening message")  # fmt: skip


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
    try:
        await ws.close(code=code, reason=reason)
    except RuntimeError:  # already closed
        pass
