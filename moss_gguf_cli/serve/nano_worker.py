"""The worker of a server that speaks MOSS-TTS-Nano: the Scheduler's surface (speak, stream,
encode_voice, the queue's gauges, shutdown) over nano/engine.NanoEngine.

One request is spoken at a time, in arrival order (the engine holds one KV sequence; a Nano
frame is milliseconds, so a queue drains fast). Each frame asks whether the request is still
wanted, so a client that leaves or a server that stops ends it within a frame. A whole answer
is the streamed pieces joined: the same engine output, the same bytes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..nano.engine import NanoEngine, NanoProfile
from .api_errors import ApiError, QueueFull, ShuttingDown
from .failures import Cancelled, api_error
from .scheduler import Delta, SpeechJob, SpeechStream, settle

log = logging.getLogger(__name__)
VARIANT = "MOSS-TTS-Nano"


@dataclass(frozen=True)
class NanoInfo:
    """What the routes and the start line read of the model (the delay Synthesizer's `info`)."""

    variant: str
    n_vq: int
    sampling_rate: int
    channels: int
    frame_samples: int


@dataclass
class NanoServeProfile:
    """A finished request's figures, named as the metrics and the SSE usage read them."""

    prompt_rows: int
    steps: int  # frames made
    frames: int
    audio_s: float
    chunks: int
    prefill_s: float
    generation_s: float
    runaways: int = 0
    prefix_rows: int = 0
    embed_s: float = 0.0
    backbone_s: float = 0.0
    heads_s: float = 0.0
    sampling_s: float = 0.0

    @classmethod
    def of(cls, p: NanoProfile, chunks: int, runaways: int, rate: int) -> NanoServeProfile:
        return cls(p.prompt_rows, p.frames, p.frames, p.samples / rate, chunks, p.prefill_s,
                   p.global_s + p.local_s, runaways, backbone_s=p.global_s + p.local_s)  # fmt: skip


@dataclass
class NanoServeResult:
    pieces: list[np.ndarray]  # (channels, samples) float32, as streamed
    profile: NanoServeProfile
    chunks: list[Any]
    runaways: list[int]
    cut: list[int] = field(default_factory=list)

    @property
    def waveform(self) -> np.ndarray:
        return np.concatenate(self.pieces, axis=1)


@dataclass(eq=False)
class _Task:
    kind: str  # "speech" or "voice"
    job: SpeechJob | None = None
    clip: Path | None = None
    on_audio: Callable[[Delta], None] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    cancel: threading.Event = field(default_factory=threading.Event)


class _EngineView:
    """`scheduler.tts` as the routes, metrics and start line read it."""

    def __init__(self, engine: NanoEngine):
        self._engine = engine
        self.info = NanoInfo(VARIANT, engine.nano.n_vq, engine.sample_rate, engine.channels,
                             engine.frame_samples)  # fmt: skip
        self.engine = self  # metrics read tts.engine.active
        self.active: list[Any] = []
        self.adapters: dict[str, Any] = {}  # no LoRA adapters: /v1/models lists none

    def close(self) -> None:
        self._engine.close()


class NanoScheduler:
    def __init__(
        self,
        engine: NanoEngine,
        max_queue: int,
        on_speech: Callable[[Any], None] | None = None,
        stall_s: float = 300.0,
    ):
        self.engine = engine
        self.tts = _EngineView(engine)
        self.max_queue, self.stall_s = max_queue, stall_s
        self.retries = 0
        self.batch_max = 0
        self._on_speech = on_speech
        self._cond = threading.Condition()
        self._waiting: deque[_Task] = deque()
        self._running: _Task | None = None
        self._beat = time.monotonic()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="moss-gguf-nano", daemon=True)

    # -- gauges

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return self._running is not None

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def idle_s(self) -> float:
        return time.monotonic() - self._beat if self._running is not None else 0.0

    @property
    def stalled(self) -> bool:
        return self.idle_s > self.stall_s

    def start(self) -> None:
        self._thread.start()

    # -- what routes call

    async def speak(self, job: SpeechJob) -> NanoServeResult:
        result = await self._submit(_Task("speech", job))
        if self._on_speech is not None:
            self._on_speech(result.profile)
        return result

    def stream(self, job: SpeechJob, loop: asyncio.AbstractEventLoop) -> SpeechStream:
        stream = SpeechStream(loop, self._on_speech)
        task = _Task("speech", job, on_audio=stream.put)
        stream.task = task
        task.future.add_done_callback(stream.finished)
        self._enqueue(task)
        return stream

    async def encode_voice(self, clip: Path) -> np.ndarray:
        return await self._submit(_Task("voice", clip=clip))

    # -- lifetime

    def shutdown(self) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            dropped, running = list(self._waiting), self._running
            self._waiting.clear()
            self._cond.notify_all()
        for task in [*dropped, *([running] if running else [])]:
            task.cancel.set()
            settle(task.future, error=ShuttingDown())

    def close(self, timeout: float = 10.0) -> None:
        self.shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the running request did not stop in %.0f s; leaving it", timeout)
            return
        self.tts.close()

    # -- inside

    def _enqueue(self, task: _Task) -> None:
        with self._cond:
            if self._closing:
                raise ShuttingDown()
            if len(self._waiting) + (self._running is not None) > self.max_queue:
                raise QueueFull(self.max_queue)
            self._waiting.append(task)
            self._cond.notify()

    async def _submit(self, task: _Task) -> Any:
        self._enqueue(task)
        try:
            return await asyncio.wrap_future(task.future)
        except asyncio.CancelledError:
            task.cancel.set()  # the client left: dropped if waiting, stopped if running
            raise

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                task = self._running = self._waiting.popleft()
            self._beat = time.monotonic()
            try:
                if not task.cancel.is_set():
                    settle(task.future, self._run(task))
                else:
                    settle(task.future, error=Cancelled())
            except BaseException as exc:  # noqa: BLE001 - every failure answers its request
                settle(task.future, error=api_error(exc, task.kind, task.job))
            finally:
                with self._cond:
                    self._running = None

    def _run(self, task: _Task) -> Any:
        engine = self.engine
        if task.kind == "voice":
            return engine.reference_codes(task.clip)
        job = task.job
        assert job is not None
        settings = engine.config.settings.override(
            **(job.sampling or {}), max_new_tokens=job.max_new_tokens,
            min_new_tokens=job.min_new_tokens, seed=job.seed)  # fmt: skip
        speech = engine.speak(job.text, job.reference_codes, settings)

        def on_frame() -> None:
            self._beat = time.monotonic()
            if task.cancel.is_set():
                raise Cancelled()

        speech.on_frame = on_frame
        pieces = []
        with engine.lock:
            for piece in speech:
                pieces.append(piece)
                if task.on_audio is not None:
                    task.on_audio(Delta(piece, speech.current + 1, len(speech.chunks), []))
        if not speech.frames:
            raise ApiError(422, "the model stopped before its first frame, so there is no "
                           "audio; send another seed, or min_new_tokens to mask the stop",
                           param="min_new_tokens", code="no_audio")  # fmt: skip
        runaways = [c.index + 1 for c in speech.chunks if c.ended == "max"]
        profile = NanoServeProfile.of(speech.profile, len(speech.chunks), len(runaways),
                                      engine.sample_rate)  # fmt: skip
        return NanoServeResult(pieces, profile, speech.chunks, runaways)
