"""Scheduler: the one serve core, over a model family's Stepper (stepper.py).

A family's speaking side is not thread-safe (one llama.cpp context, or engines stepped in
turn), so one worker thread drives it: speech jobs start in the order they came as the
stepper has room (free KV sequences, free engines), every running one goes a step at a time,
and a voice to encode runs between two steps. Routes only submit jobs and await them:

    result = await scheduler.speak(job)            # job: the family's request builder's
    stream = scheduler.stream(job, loop)           # chunks as they are made
    codes = await scheduler.encode_voice(Path("clip.wav"))

A job is checked as it comes (`Stepper.prepare`: a 400 before it waits). One that cannot wait
is refused at once: 429 when `max_queue` jobs already wait for room, 503 once shutdown() was
called. A job stops at its next generation step when its client goes away or the server stops
(its `Watch` is the cancellation point), and its room is free for the next job from the step
after.

Failure is per job: a request that fails in a step ends alone with its error, answered by
`failures.api_error` (4xx where the request caused it; the family's own errors by its
stepper's `explain`). A watchdog thread answers every job with an error once the worker has
made no progress (no step, prefill or job start) for `stall_s` while jobs run, and /health
reports the server stalled until it moves again. The same for every family: the core never
asks which one it holds.
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

from ..errors import is_debug
from .api_errors import QueueFull, ShuttingDown, Stalled
from .failures import api_error
from .stepper import Delta, ServedModel, Stepper, Watch

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Task:
    """A speech job (its PREPARED request, streamed through ON_AUDIO or answered whole) or a
    voice to encode (CLIP)."""

    kind: str  # "speech" or "voice"
    job: Any = None  # what a speech task asked for (its errors name its fields)
    prepared: Any = None
    clip: Path | None = None
    on_audio: Callable[[Delta], None] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    cancel: threading.Event = field(default_factory=threading.Event)


class Watchdog:
    """One for the scheduler: requests that cannot be served because the worker stopped
    moving are answered (500 for those running, 503 for those waiting) rather than left
    hanging. WATCHED says `stalled`, `idle_s`, `stall_s`, `closing` and `tasks()`."""

    def __init__(self, watched: Any):
        self._watched = watched
        self._thread = threading.Thread(target=self._watch, name="moss-gguf-watchdog",
                                        daemon=True)  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        w, reported = self._watched, False
        while not w.closing:
            time.sleep(min(1.0, w.stall_s / 4))
            if not w.stalled:
                reported = False
                continue
            running, waiting = w.tasks()
            if not reported:
                log.error("no generation step finished for %.0f s with %d request(s) running; "
                          "answering them (/health reports 503)", w.idle_s, len(running))
                reported = True
            for task in running:
                task.cancel.set()
                settle(task.future, error=Stalled(w.stall_s, running=True))
            for task in waiting:
                task.cancel.set()
                settle(task.future, error=Stalled(w.stall_s, running=False))


class Scheduler:
    """STEPPER's requests from one bounded queue, on one worker thread; ON_SPEECH gets each
    finished speech's profile (the metrics)."""

    def __init__(
        self,
        stepper: Stepper,
        max_queue: int,
        on_speech: Callable[[Any], None] | None = None,
        stall_s: float = 300.0,
    ):
        self.stepper = stepper
        self.max_queue = max_queue
        self.stall_s = stall_s
        self._beat = time.monotonic()  # the worker's last sign of life besides the stepper's
        self._on_speech = on_speech
        self._cond = threading.Condition()
        self._waiting: deque[_Task] = deque()
        self._running: list[_Task] = []
        self._free = stepper.free  # room to start requests in (the worker keeps it current)
        self.batch_max = 0  # the most rows stepped together
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="moss-gguf-synth", daemon=True)
        self._watchdog = Watchdog(self)

    # -- what routes call

    @property
    def info(self) -> ServedModel:
        return self.stepper.info

    @property
    def waiting(self) -> int:
        """Jobs waiting for room."""
        return max(0, len(self._waiting) - self._free)

    @property
    def busy(self) -> bool:
        return bool(self._running)

    @property
    def active(self) -> int:
        """Rows stepped together now (0 when nothing runs)."""
        return self.stepper.stepped if self._running else 0

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def idle_s(self) -> float:
        """Seconds since the worker last made progress while jobs run (0 when none run)."""
        if not self._running:
            return 0.0
        last = max(self.stepper.last_progress, self._beat)
        return max(0.0, time.monotonic() - last)

    @property
    def stalled(self) -> bool:
        """Jobs run, and no step, prefill or job start came for `stall_s` seconds."""
        return self.idle_s > self.stall_s

    def start(self) -> None:
        self._thread.start()
        self._watchdog.start()

    async def speak(self, job: Any) -> Any:
        """JOB spoken whole: the stepper's result (waveform, profile, chunks)."""
        result = await self._submit(_Task("speech", job, self._prepare(job)))
        if self._on_speech is not None:
            self._on_speech(result.profile)
        return result

    def stream(self, job: Any, loop: asyncio.AbstractEventLoop) -> SpeechStream:
        """JOB queued now (its 400, 429 or 503 raised here); its audio arrives through the
        SpeechStream, in order, each piece saying which chunk of the text it belongs to."""
        prepared = self._prepare(job)
        stream = SpeechStream(loop, self._on_speech)
        task = _Task("speech", job, prepared, on_audio=stream.put)
        stream.task = task
        task.future.add_done_callback(stream.finished)
        self._enqueue(task)
        return stream

    async def encode_voice(self, clip: Path) -> np.ndarray:
        """The reference codes (T, n_vq) of an audio file (any format soundfile reads)."""
        return await self._submit(_Task("voice", clip=clip))

    # -- lifetime

    def shutdown(self) -> None:
        """Accept nothing more; fail what waits and stop what runs with 503. Returns at once."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            dropped = list(self._waiting)
            self._waiting.clear()
            running = list(self._running)
            self._cond.notify_all()
        for task in [*dropped, *running]:
            task.cancel.set()
            settle(task.future, error=ShuttingDown())
        if dropped or running:
            log.info("stopping: %d request(s) answered 503", len(dropped) + len(running))

    def close(self, timeout: float = 10.0) -> None:
        """shutdown(), wait for the worker, free the model (unless the worker is stuck in it)."""
        self.shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the running request did not stop in %.0f s; leaving it", timeout)
            return
        self.stepper.close()  # closing twice (lifespan, then run_server's finally) is harmless

    def tasks(self) -> tuple[list[_Task], list[_Task]]:
        """(running, waiting), as they are now (the watchdog's view)."""
        with self._cond:
            return list(self._running), list(self._waiting)

    # -- inside

    def _prepare(self, job: Any) -> Any:
        """JOB as its stepper checked it: a request that cannot be spoken whole is a 400 now,
        before it waits or makes a frame, and a stream's before its status is sent."""
        try:
            return self.stepper.prepare(job)
        except Exception as exc:  # noqa: BLE001 - answered as the worker answers it
            raise self._answer(exc, "speech", job) from None

    def _enqueue(self, task: _Task) -> None:
        with self._cond:
            if self._closing:
                raise ShuttingDown()
            if len(self._waiting) + 1 - self._free > self.max_queue:
                raise QueueFull(self.max_queue)
            self._waiting.append(task)
            self._cond.notify()

    async def _submit(self, task: _Task) -> Any:
        self._enqueue(task)
        try:
            return await asyncio.wrap_future(task.future)
        except asyncio.CancelledError:
            task.cancel.set()  # the client went away: drop it, or stop it at its next step
            raise

    def _next(self) -> list[_Task] | None:
        """The jobs to start now (speech ones as far as there is room); None: stop."""
        stepper = self.stepper
        with self._cond:
            while not self._waiting and not stepper.busy and not self._closing:
                self._cond.wait()
            if self._closing:
                return None
            tasks, free, started = [], stepper.free, False
            while self._waiting and (self._waiting[0].kind == "voice" or free > 0):
                head = self._waiting[0]
                speech = head.kind == "speech"
                if speech and not stepper.admits(head.prepared, started):
                    break  # it may not run beside what runs (the family says): it waits
                tasks.append(self._waiting.popleft())
                free -= speech
                started = started or speech
            self._running += tasks
            self._free = free
            self._beat = time.monotonic()
            return tasks

    def _work(self) -> None:
        stepper = self.stepper
        while (tasks := self._next()) is not None:
            for task in tasks:
                self._start(task)
            try:
                finished = stepper.step()
            except Exception as exc:  # noqa: BLE001 - a bug: every running request is answered
                log.error("a generation step failed: %s", exc, exc_info=is_debug())
                stepper.stop(exc)
                finished = [(t, None, exc) for t in self.tasks()[0] if t.kind == "speech"]
            self.batch_max = max(self.batch_max, stepper.stepped)
            for task, value, error in finished:
                self._end(task, value, error)
            with self._cond:
                self._free = stepper.free
        stepper.stop(ShuttingDown())  # stopping: free what still runs (answered 503)
        for task in self.tasks()[0]:
            self._done(task)

    def _start(self, task: _Task) -> None:
        """Encode a voice at once; begin a speech job (the stepper steps it from now on)."""
        if task.cancel.is_set() or not task.future.set_running_or_notify_cancel():
            settle(task.future, error=ShuttingDown())  # nobody is listening any more
            self._done(task)
            return
        try:
            if task.kind == "voice":
                assert task.clip is not None
                self._end(task, self.stepper.encode_voice(task.clip), None)
            else:
                self.stepper.start(task, task.prepared, Watch(task.cancel), task.on_audio)
        except Exception as exc:  # noqa: BLE001 - answered; the worker goes on
            self._end(task, None, exc)

    def _end(self, task: _Task, value: Any, error: BaseException | None) -> None:
        if error is None:
            settle(task.future, value=value)
        else:
            settle(task.future, error=self._answer(error, task.kind, task.job))
        self._done(task)

    def _answer(self, error: BaseException, kind: str, job: Any) -> Exception:
        return api_error(error, kind, job, self.stepper.explain)

    def _done(self, task: _Task) -> None:
        with self._cond:
            if task in self._running:
                self._running.remove(task)


_END = object()


class SpeechStream:
    """The chunks of one streamed job, handed from the worker thread to the event loop.

        stream = scheduler.stream(job, loop)
        async for delta in stream: ...      # Delta: audio and its chunk; errors raise ApiError
        stream.close()                      # the client left: the job stops at its next step
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_speech=None):
        self.task: _Task | None = None
        self.profile: Any = None  # the stepper's result's, once it ended
        self.result: Any = None
        self.done = False
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._on_speech = on_speech

    def put(self, delta: Delta) -> None:  # worker thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, delta)

    def finished(self, future: concurrent.futures.Future) -> None:  # worker thread
        error = future.exception() if not future.cancelled() else ShuttingDown()
        item = error if error is not None else (_END, future.result())
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def __aiter__(self) -> SpeechStream:
        return self

    async def __anext__(self) -> Delta:
        if self.done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.done = True
            raise item
        if isinstance(item, tuple) and item[0] is _END:
            self.done, self.result, self.profile = True, item[1], item[1].profile
            if self._on_speech is not None:
                self._on_speech(self.profile)
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        """Stop the job (if it still runs or waits); harmless once it has ended."""
        if self.task is not None and not self.done:
            self.task.cancel.set()


def settle(future: concurrent.futures.Future, value: Any = None, error: Exception | None = None):
    """Resolve FUTURE unless it already is (shutdown may have answered it first)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass

