"""The worker of a server that speaks MOSS-TTS-Nano: the Scheduler's surface (speak, stream,
encode_voice, the queue's gauges, shutdown) over nano/engine.NanoEngine.

Each engine speaks one request at a time (it holds one KV sequence); the server loads as many
engines as requests it speaks at once (server._load_nano: at most one a core), and the others
wait in arrival order. One worker thread steps every running request a frame at a time in
turn, each on its own engine with every core: a lone request has the whole machine, two share
it, and llama.cpp's OpenMP threads only ever serve one caller (threads of two callers on 2
cores made each frame wait on the kernel: a lone request 1.7x slower, measured). Each frame
asks whether the request is still wanted, so a client that leaves or a server that stops ends
it within a frame. A whole answer is the streamed pieces joined: the same engine output, the
same bytes. A request is checked whole as it comes (every chunk against n_ctx): one that could
not finish is a 400 before it waits, never a frame made and then lost.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..hold_points import hold
from ..nano.engine import NanoEngine, NanoProfile, NanoRequest
from .api_errors import ApiError, QueueFull, ShuttingDown
from .failures import Cancelled, api_error
from .scheduler import Delta, SpeechJob, SpeechStream, Watchdog, settle
from .schemas import SpeechRequest
from .settings import DEFAULT_VOICE, OPENAI_VOICES

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
    request: NanoRequest | None = None  # a speech's, checked as it came (_admit)
    on_audio: Callable[[Delta], None] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    cancel: threading.Event = field(default_factory=threading.Event)


class _EngineView:
    """`scheduler.tts` as the routes, metrics and start line read it."""

    def __init__(self, engines: list[NanoEngine]):
        engine = engines[0]
        self._engines = engines
        self.info = NanoInfo(VARIANT, engine.nano.n_vq, engine.sample_rate, engine.channels,
                             engine.frame_samples)  # fmt: skip
        self.engine = self  # metrics read tts.engine.active
        self.active: list[Any] = []
        self.width = len(engines)
        self.adapters: dict[str, Any] = {}  # no LoRA adapters: /v1/models lists none

    def close(self) -> None:
        for engine in self._engines:
            engine.close()


class NanoScheduler:
    """ENGINES (each a loaded NanoEngine with its own llama.cpp contexts over the same mmapped
    weights) speak that many requests at once, taking turns a frame at a time on one worker
    thread; the rest wait in arrival order."""

    def __init__(
        self,
        engines: list[NanoEngine],
        max_queue: int,
        on_speech: Callable[[Any], None] | None = None,
        stall_s: float = 300.0,
    ):
        self.engines = engines
        self.tts = _EngineView(engines)
        self.max_queue, self.stall_s = max_queue, stall_s
        self.retries = 0
        self.batch_max = 0  # the most requests spoken at once
        self._on_speech = on_speech
        self._cond = threading.Condition()
        self._waiting: deque[_Task] = deque()
        self._running: list[_Task] = []
        self._beat = time.monotonic()
        self._closing = False
        self._threads = [threading.Thread(target=self._work, daemon=True,
                                          name="moss-gguf-nano")]  # fmt: skip
        self._watchdog = Watchdog(self)  # the delay family's, the same

    # -- gauges

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return bool(self._running)

    @property
    def speaking(self) -> int:
        """Requests being spoken now."""
        return len(self._running)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def idle_s(self) -> float:
        return time.monotonic() - self._beat if self._running else 0.0

    @property
    def stalled(self) -> bool:
        return self.idle_s > self.stall_s

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        self._watchdog.start()

    def tasks(self) -> tuple[list[_Task], list[_Task]]:
        """(running, waiting), as they are now (the watchdog's view)."""
        with self._cond:
            return list(self._running), list(self._waiting)

    # -- what routes call

    async def speak(self, job: SpeechJob) -> NanoServeResult:
        result = await self._submit(_Task("speech", job, request=self._admit(job)))
        if self._on_speech is not None:
            self._on_speech(result.profile)
        return result

    def stream(self, job: SpeechJob, loop: asyncio.AbstractEventLoop) -> SpeechStream:
        request = self._admit(job)
        stream = SpeechStream(loop, self._on_speech)
        task = _Task("speech", job, request=request, on_audio=stream.put)
        stream.task = task
        task.future.add_done_callback(stream.finished)
        self._enqueue(task)
        return stream

    async def encode_voice(self, clip: Path) -> np.ndarray:
        return await self._submit(_Task("voice", clip=clip))

    def _admit(self, job: SpeechJob) -> NanoRequest:
        """JOB's chunks and settings, checked as it comes (every chunk's length against
        n_ctx): a request that cannot be spoken whole is a 400 now, before it waits or makes a
        frame, and a stream's before its status is sent. Tokenizing the text is all it costs."""
        engine = self.engines[0]  # the engines share one folder and n_ctx
        settings = engine.config.settings.override(
            **(job.sampling or {}), max_new_tokens=job.max_new_tokens,
            min_new_tokens=job.min_new_tokens, seed=job.seed)  # fmt: skip
        try:
            return engine.prepare(job.text, job.reference_codes, settings)
        except UsageError as exc:  # min_new_tokens above the folder's max: the route can't see it
            raise ApiError(400, exc.message, param="min_new_tokens",
                           code="invalid_value") from None  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - answered as the worker answers it
            raise api_error(exc, "speech", job) from None

    # -- lifetime

    def shutdown(self) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            dropped, running = list(self._waiting), list(self._running)
            self._waiting.clear()
            self._cond.notify_all()
        for task in [*dropped, *running]:
            task.cancel.set()
            settle(task.future, error=ShuttingDown())

    def close(self, timeout: float = 10.0) -> None:
        self.shutdown()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)
        if any(thread.is_alive() for thread in self._threads):
            log.warning("a running request did not stop in %.0f s; leaving it", timeout)
            return
        self.tts.close()

    # -- inside

    def _enqueue(self, task: _Task) -> None:
        with self._cond:
            if self._closing:
                raise ShuttingDown()
            free = len(self.engines) - len(self._running)
            if len(self._waiting) + 1 - free > self.max_queue:
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
        free = list(self.engines)
        turns: list[tuple[_Task, NanoEngine, Generator[None, None, Any]]] = []
        while True:
            started = []
            with self._cond:
                while not self._waiting and not turns and not self._closing:
                    self._cond.wait()
                if self._closing:
                    break
                while self._waiting and free:
                    task, engine = self._waiting.popleft(), free.pop(0)
                    self._running.append(task)
                    self.batch_max = max(self.batch_max, len(self._running))
                    started.append((task, engine))
            self._beat = time.monotonic()
            for task, engine in started:
                if task.cancel.is_set():
                    self._finish(task, engine, free, error=Cancelled())
                elif task.kind == "voice":  # a clip's encoding, at once
                    self._step(task, engine, free, lambda e=engine, c=task.clip:
                               e.reference_codes(c))  # fmt: skip
                else:
                    turns.append((task, engine, self._speech(engine, task)))
            for turn in list(turns):
                task, engine, steps = turn
                if not self._step(task, engine, free, lambda s=steps: next(s)):
                    turns.remove(turn)
        for _, _, steps in turns:
            steps.close()  # the engines' locks let go

    def _step(self, task: _Task, engine: NanoEngine, free: list[NanoEngine],
              call: Callable[[], Any]) -> bool:  # fmt: skip
        """CALL for TASK; False once TASK is answered (its result, or its failure)."""
        try:
            value = call()
            if task.kind == "speech":
                return True
        except StopIteration as done:
            value = done.value
        except BaseException as exc:  # noqa: BLE001 - every failure answers its request
            self._finish(task, engine, free, error=api_error(exc, task.kind, task.job))
            return False
        self._finish(task, engine, free, value)
        return False

    def _finish(self, task: _Task, engine: NanoEngine, free: list[NanoEngine], value: Any = None,
                error: Exception | None = None) -> None:  # fmt: skip
        settle(task.future, value, error)
        with self._cond:
            self._running.remove(task)
            # the engine freed last speaks next: a lone client's voice finds its shared
            # prompt rows kept there (each engine keeps its own)
            free.insert(0, engine)

    def _speech(self, engine: NanoEngine, task: _Task) -> Generator[None, None, NanoServeResult]:
        """TASK spoken a frame a step; the result is the generator's return value."""
        assert task.request is not None
        speech = engine.speech(task.request)

        def on_frame() -> None:
            self._beat = time.monotonic()
            hold("serve")  # a test's fixed point: a request is generating
            if task.cancel.is_set():
                raise Cancelled()

        speech.on_frame = on_frame
        pieces = []
        with engine.lock:
            for piece in speech.steps():
                if piece is not None:
                    pieces.append(piece)
                    if task.on_audio is not None:
                        task.on_audio(Delta(piece, speech.current + 1, len(speech.chunks), []))
                yield
        if not speech.frames:
            raise ApiError(422, "the model stopped before its first frame, so there is no "
                           "audio; send another seed, or min_new_tokens to mask the stop",
                           param="min_new_tokens", code="no_audio")  # fmt: skip
        runaways = [c.index + 1 for c in speech.chunks if c.ended == "max"]
        profile = NanoServeProfile.of(speech.profile, len(speech.chunks), len(runaways),
                                      engine.sample_rate)  # fmt: skip
        return NanoServeResult(pieces, profile, speech.chunks, runaways)


def nano_job(service: Any, body: SpeechRequest) -> SpeechJob:
    """A MOSS-TTS-Nano request (routes.Service.own_job): the text, a stored voice or the
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
    return SpeechJob(text=body.input, reference_codes=codes, seed=body.seed,
                     max_new_tokens=body.max_new_tokens, sampling=body.sampling(),
                     min_new_tokens=body.min_new_tokens)  # fmt: skip
