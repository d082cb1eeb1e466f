"""Streamed speech: `stream_format` "audio" (the response format's bytes, chunked) and "sse"
(OpenAI's server-sent events: `speech.audio.delta` with base64 audio, then
`speech.audio.done` with the usage).

Streams carry `pcm` and `wav` (a WAV header whose sizes say "unknown", then the samples);
`stream_format: "audio"` with a compressed format still answers the whole file, as before.
The first chunk is awaited before the response starts, so a request that fails early gets its
error status; the chunks after it are sent as the worker makes them. A client that leaves
stops its job at the next generation step (counted in moss_gguf_streams_abandoned_total).
A stream that cannot finish (the server stops, the generation fails) never looks complete:
SSE ends with an `error` event and no `speech.audio.done`; raw audio loses its connection
without the chunked terminator (StreamCut, caught by routes._Guard).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from . import audio
from .api_errors import ApiError
from .scheduler import SpeechStream
from .schemas import SpeechRequest
from .stepper import Delta

log = logging.getLogger(__name__)

STREAM_FORMATS = ("pcm", "wav")


class StreamCut(Exception):
    """A started stream failed: its connection is dropped, so it cannot look complete."""

    def __init__(self, error: ApiError):
        super().__init__(error.message)
        self.error = error


# where a cut stream is noted in its ASGI scope: the layers between the stream and the server
# may still send the body's clean end, which routes._Guard then refuses to pass on
CUT = "moss_gguf.stream_cut"


def wants_stream(body: SpeechRequest) -> bool:
    """Whether BODY is answered by a stream; refuses what cannot be streamed (400)."""
    if body.stream_format is None:
        return False
    if body.response_format not in STREAM_FORMATS:
        if body.stream_format == "audio":
            return False  # the whole file, chunked by the server as any response
        raise ApiError(400, f"stream_format 'sse' carries {' or '.join(STREAM_FORMATS)}, not "
                       f"{body.response_format!r}; ask for response_format 'pcm' or 'wav'",
                       param="response_format", code="unsupported_value")  # fmt: skip
    if body.speed != 1.0:
        raise ApiError(400, "speed changes the tempo of the whole utterance and cannot be "
                       "streamed; leave speed at 1.0 or leave stream_format out",
                       param="speed", code="unsupported_value")  # fmt: skip
    return True


async def stream_speech(
    request: Request, body: SpeechRequest, job: Any, scheduler, out, abandoned
) -> StreamingResponse:
    """The streamed response for JOB (after its first chunk is made); OUT: the family's
    output (serve/output.py), which turns each piece into the format's bytes."""
    stream = scheduler.stream(job, asyncio.get_running_loop())
    try:
        first = await _first(request, stream)
    except BaseException:
        stream.close()
        raise
    streamer = out.streamer(body.response_format)
    chunks = _chunks(first, stream, abandoned, request.scope, streamer)
    if body.stream_format == "sse":
        return StreamingResponse(_sse(chunks, streamer.header, stream, request.scope),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})  # fmt: skip
    return StreamingResponse(_audio(chunks, streamer.header),
                             media_type=audio.MEDIA_TYPES[body.response_format])  # fmt: skip


async def _first(request: Request, stream: SpeechStream) -> Delta:
    """The first chunk, or ApiError 499 if the client leaves before it is made."""
    return await unless_gone(request, stream.__anext__())


async def unless_gone(request: Request, work: Awaitable[Any]) -> Any:
    """WORK's result; if the client disconnects first, WORK is cancelled (the scheduler drops
    a waiting job and stops a running one at its next step) and a 499 is logged for it."""
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not job.done():
        job.cancel()
        log.info("%s %s: the client went away; its request was cancelled",
                 request.method, request.url.path)  # fmt: skip
        raise ApiError(499, "the client closed the connection", code="client_closed")
    return job.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is already read: what comes next is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _chunks(
    first: Delta, stream: SpeechStream, abandoned, scope: dict, streamer
) -> AsyncIterator[tuple[bytes, Delta]]:
    """16-bit PCM bytes of each piece (with the piece), and what the streamer holds back
    until the end; stops the job if the response is dropped midway."""
    try:
        last = first
        yield streamer.piece(first.audio), first
        async for delta in stream:
            last = delta
            yield streamer.piece(delta.audio), delta
        if tail := streamer.end():
            yield tail, last
    except ApiError as exc:  # the headers are out: the stream can only end early
        log.warning("a streamed request failed after its first chunk: %s", exc.message)
        scope[CUT] = cut = StreamCut(exc)
        raise cut from None
    finally:
        if not stream.done:  # the client went away (the response was cancelled)
            stream.close()
            abandoned.inc()
            log.info("a streaming client went away; its request was stopped")


async def _audio(chunks: AsyncIterator[tuple[bytes, Delta]], header: bytes
                 ) -> AsyncIterator[bytes]:  # fmt: skip
    if header:
        yield header
    async for data, _delta in chunks:
        yield data


async def _sse(
    chunks: AsyncIterator[tuple[bytes, Delta]], header: bytes, stream: SpeechStream, scope: dict
) -> AsyncIterator[bytes]:
    """OpenAI's events, each also saying which chunk of the text it carries (`chunk` of
    `chunks`, 1-based) and the chunks that ran away so far (`runaways`: their audio may
    be cut; the headers are out, so this is where a client learns it)."""
    try:
        async for data, delta in chunks:
            yield _event({"type": "speech.audio.delta",
                          "audio": base64.b64encode(header + data).decode(),
                          "chunk": delta.chunk, "chunks": delta.chunks,
                          "runaways": delta.runaways})  # fmt: skip
            header = b""
    except StreamCut as cut:  # the event stream itself can say it (OpenAI's error event)
        scope.pop(CUT, None)  # said in the stream: it may end cleanly
        # the error object a response would carry, under an event of type "error"
        yield _event({"type": "error", **cut.error.body()})
        return
    if stream.result is not None:
        result = stream.result
        used, made = result.profile.prompt_rows, result.profile.steps
        yield _event({"type": "speech.audio.done", "usage": {
            "input_tokens": used, "output_tokens": made, "total_tokens": used + made},
            "chunks": len(result.chunks), "runaways": result.runaways,
            "cut": result.cut})  # fmt: skip


def _event(data: dict) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()
