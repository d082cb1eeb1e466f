"""Scheduler: the one owner of the Synthesizer, its bounded queue and its worker thread.

The synthesizer is not thread-safe (one llama.cpp context), so one worker thread drives it:
speech jobs join its batch engine (tts/engine.py: up to max_batch utterances, one KV
sequence each, stepped together) in the order they came, as sequences free up; a voice to
encode runs between two steps. Routes only submit jobs and await them:

    result = await scheduler.speak(SpeechJob(text="Hello", seed=1))
    stream = scheduler.stream(SpeechJob(text="Hello"), loop)   # chunks as they are made
    codes = await scheduler.encode_voice(Path("clip.wav"))

A job that cannot wait is refused at once: 429 when `max_queue` jobs already wait for a free
sequence, 503 once shutdown() was called. A job stops at its next generation step when its
client goes away or the server stops (the progress reporter it runs with is the cancellation
point), and its sequence is free for the next job from the step after.

Failure is per job: an utterance that fails in a step ends alone with its error (the engine
never raises for it, docs/ARCHITECTURE.md §10), answered by `failures.api_error` (4xx where the
request caused it). A watchdog thread answers every job with an error once the worker has made
no progress (no step, prefill or job start) for `stall_s` while jobs run, and /health reports
the server stalled until it moves again.
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
from ..hold_points import hold
from ..progress import NullProgress
from ..tts import Speaker, Synthesizer, SynthProfile, SynthResult
from ..tts.engine import Engine, Utterance
from ..tts.speech import RETRIES, Speech
from .adapters import AdapterGate
from .api_errors import QueueFull, ShuttingDown, Stalled
from .failures import Cancelled, api_error

log = logging.getLogger(__name__)


@dataclass
class SpeechJob:
    """One utterance, as the worker hands it to `Synthesizer.synthesize`."""

    text: str
    reference_codes: np.ndarray | None = None
    instruction: str | None = None
    seed: int | None = None
    max_new_tokens: int | None = None
    sampling: dict[str, float] = field(default_factory=dict)
    language: str | None = None  # a name of tts/language.py, checked by the route
    speakers: list[Speaker] | None = None  # MOSS-TTSD: a stored voice per speaker
    min_new_tokens: int | None = None  # MOSS-TTS-Nano: frames before its stop is allowed
    lora: dict[str, float] = field(default_factory=dict)  # adapter set (serve/adapters.py)

    def options(self) -> dict[str, Any]:
        """Synthesizer.prepare's keyword options."""
        return {"reference_codes": self.reference_codes, "instruction": self.instruction,
                "seed": self.seed, "max_new_tokens": self.max_new_tokens,
                "sampling": self.sampling or None, "language": self.language,
                "speakers": self.speakers}  # fmt: skip


@dataclass(eq=False)
class _Task:
    """A voice job runs at once (`run`); a speech job plans its chunks (`begin`, a
    tts/speech.Speech whose utterances join the engine as sequences free up), and `end`
    turns the finished Speech into the job's value."""

    run: Callable[[Synthesizer, NullProgress], Any] | None
    kind: str
    job: SpeechJob | None = None  # what a speech task asked for (its errors name its fields)
    begin: Callable[[Synthesizer, NullProgress], Speech] | None = None
    end: Callable[[Synthesizer, Speech], Any] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    cancel: threading.Event = field(default_factory=threading.Event)


class _Watch(NullProgress):
    """The progress reporter a job runs with: every step asks whether it is still wanted."""

    def __init__(self, cancel: threading.Event):
        self._cancel = cancel

    def advance(self, key: str, amount: float = 1, description: str | None = None) -> None:
        if key == "synth":
            hold("serve")  # a test's fixed point: a request is generating
        if self._cancel.is_set():
            raise Cancelled()


class Watchdog:
    """One for every family's scheduler: requests that cannot be served because the worker
    stopped moving are answered (500 for those running, 503 for those waiting) rather than
    left hanging. WATCHED says `stalled`, `idle_s`, `stall_s`, `closing` and `tasks()`."""

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
    def __init__(
        self,
        tts: Synthesizer,
        max_queue: int,
        on_speech: Callable[[SynthProfile], None] | None = None,
        retries: int = RETRIES,
        stall_s: float = 300.0,
    ):
        self.tts = tts
        self.max_queue = max_queue
        self.retries = retries  # how often a runaway chunk is run again
        self.stall_s = stall_s
        self._beat = time.monotonic()  # the worker's last sign of life besides the engine's
        self._on_speech = on_speech
        self._cond = threading.Condition()
        self._waiting: deque[_Task] = deque()
        self._running: list[_Task] = []
        self._free = tts.engine.width  # free sequences (the worker keeps it current)
        self.batch_max = 0  # the most utterances stepped together
        self._speeches: list[tuple[Speech, _Task]] = []  # running speech jobs (worker only)
        self._jobs: dict[int, tuple[Utterance, Speech, _Task]] = {}  # id(utterance) → its job
        self._closing = False
        self._lora = AdapterGate(tts)  # one adapter set at a time (serve/adapters.py)
        self._thread = threading.Thread(target=self._work, name="moss-gguf-synth", daemon=True)
        self._watchdog = Watchdog(self)

    # -- what routes call

    @property
    def waiting(self) -> int:
        """Jobs waiting for a free sequence."""
        return max(0, len(self._waiting) - self._free)

    @property
    def busy(self) -> bool:
        return bool(self._running)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def idle_s(self) -> float:
        """Seconds since the worker last made progress while jobs run (0 when none run)."""
        if not self._running:
            return 0.0
        last = max(self.tts.engine.last_progress, self._beat)
        return max(0.0, time.monotonic() - last)

    @property
    def stalled(self) -> bool:
        """Jobs run, and no step, prefill or job start came for `stall_s` seconds."""
        return self.idle_s > self.stall_s

    def start(self) -> None:
        self._thread.start()
        self._watchdog.start()

    async def speak(self, job: SpeechJob) -> SynthResult:
        def begin(tts: Synthesizer, watch: NullProgress) -> Speech:
            return tts.speech(job.text, watch, retries=self.retries, share_first=True,
                              **job.options())  # fmt: skip

        def end(tts: Synthesizer, speech: Speech) -> SynthResult:
            return tts.speech_result(speech)

        result = await self._submit(_Task(None, "speech", job, begin, end))
        if self._on_speech is not None:
            self._on_speech(result.profile)
        return result

    def stream(self, job: SpeechJob, loop: asyncio.AbstractEventLoop) -> SpeechStream:
        """JOB queued now (429/503 raised here); its audio arrives through the SpeechStream,
        in order, each piece saying which chunk of the text it belongs to."""
        stream = SpeechStream(loop, self._on_speech)

        def begin(tts: Synthesizer, watch: NullProgress) -> Speech:
            made: list[Speech] = []

            def on_audio(audio: np.ndarray, index: int) -> None:
                speech = made[0]
                stream.put(Delta(audio, index + 1, len(speech.chunks), list(speech.runaways)))

            made.append(tts.speech(job.text, watch, on_audio=on_audio, retries=self.retries,
                                   share_first=True, **job.options()))  # fmt: skip
            return made[0]

        def end(tts: Synthesizer, speech: Speech) -> SynthResult:
            return tts.speech_result(speech)

        task = _Task(None, "speech", job, begin, end)
        stream.task = task
        task.future.add_done_callback(stream.finished)
        self._enqueue(task)
        return stream

    async def encode_voice(self, clip: Path) -> np.ndarray:
        """The reference codes (T, n_vq) of an audio file (any format soundfile reads)."""
        return await self._submit(_Task(lambda tts, _watch: tts.encode_reference(clip), "voice"))

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
        self.tts.close()  # closing twice (lifespan, then run_server's finally) is harmless

    # -- inside

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

    def _next(self, engine: Engine) -> list[_Task] | None:
        """The jobs to start now (speech ones as far as sequences are free); None: stop."""
        with self._cond:
            while (not self._waiting and not engine.active and not self._closing
                   and not any(sp.pending for sp, _ in self._speeches)):  # fmt: skip
                self._cond.wait()
            if self._closing:
                return None
            tasks, free = [], len(engine.free)
            busy = bool(engine.active or self._speeches)
            while self._waiting and (self._waiting[0].begin is None or free > 0):
                head = self._waiting[0]
                if head.begin is not None and not self._lora.admits(head.job and head.job.lora,
                                                                    busy):  # fmt: skip
                    break  # another adapter set: it waits until this batch is done
                task = self._waiting.popleft()
                free -= task.begin is not None
                busy = busy or task.begin is not None
                tasks.append(task)
            self._running += tasks
            self._free = free
            self._beat = time.monotonic()
            return tasks

    def _work(self) -> None:
        engine = self.tts.engine
        jobs = self._jobs
        while (tasks := self._next(engine)) is not None:
            new = [sp for task in tasks if (sp := self._start_task(task)) is not None]
            self._join(engine, new, jobs)
            self.batch_max = max(self.batch_max, len(engine.active))
            try:
                ended = engine.step()
            except Exception as exc:  # noqa: BLE001 - a bug: never step the same rows again
                log.error("a generation step failed: %s", exc, exc_info=is_debug())
                for u in list(engine.active):
                    engine.leave(u, exc)
                ended = [u for u, _, _ in jobs.values() if u.finished]
            for u in ended:
                _, speech, task = jobs.pop(id(u))
                speech.ended(u)
                if speech.done:
                    self._end_task(task, speech, engine)
            with self._cond:
                self._free = len(engine.free)
        for speech, task in self._speeches:  # stopping: free what still runs (answered 503)
            speech.abort(engine, ShuttingDown())
            self._done(task)
        self._speeches.clear()

    def tasks(self) -> tuple[list[_Task], list[_Task]]:
        """(running, waiting), as they are now (the watchdog's view)."""
        with self._cond:
            return list(self._running), list(self._waiting)

    def _join(self, engine: Engine, new: list[Speech], jobs: dict) -> None:
        """Utterances into free sequences: each new job's first chunk, then the chunks that
        running jobs have ready, job by job (a long text takes the width left)."""
        firsts = [(sp, t) for sp, t in self._speeches if sp in new]
        for limit, speeches in ((1, firsts), (None, list(self._speeches))):
            for speech, task in speeches:
                free = len(engine.free) if limit is None else min(limit, len(engine.free))
                try:
                    for u in speech.ready(free):
                        engine.join(u)
                        jobs[id(u)] = (u, speech, task)
                except Exception as exc:  # noqa: BLE001 - answered; the worker goes on
                    speech.error = speech.error or exc
                    self._end_task(task, speech, engine)

    def _start_task(self, task: _Task) -> Speech | None:
        """Run a voice job; plan a speech job (its chunks join in `_join`)."""
        if task.cancel.is_set() or not task.future.set_running_or_notify_cancel():
            self._done(task)
            return None
        try:
            if task.begin is None:
                assert task.run is not None
                settle(task.future, value=task.run(self.tts, _Watch(task.cancel)))
                self._done(task)
                return None
            speech = task.begin(self.tts, _Watch(task.cancel))
            self._speeches.append((speech, task))
            return speech
        except Exception as exc:  # noqa: BLE001 - answered; the worker goes on
            self._fail(task, exc)
            return None

    def _end_task(self, task: _Task, speech: Speech, engine: Engine) -> None:
        self._speeches = [(sp, t) for sp, t in self._speeches if t is not task]
        for key in [k for k, (_, sp, _) in self._jobs.items() if sp is speech]:
            del self._jobs[key]
        try:
            if speech.error is not None:
                speech.abort(engine, speech.error)
                raise speech.error
            assert task.end is not None
            settle(task.future, value=task.end(self.tts, speech))
            self._done(task)
        except Exception as exc:  # noqa: BLE001 - answered; the worker goes on
            self._fail(task, exc)

    def _fail(self, task: _Task, exc: BaseException) -> None:
        settle(task.future, error=api_error(exc, task.kind, task.job))
        self._done(task)

    def _done(self, task: _Task) -> None:
        with self._cond:
            if task in self._running:
                self._running.remove(task)


_END = object()


@dataclass(frozen=True)
class Delta:
    """A piece of streamed audio: float32 samples of chunk CHUNK (1-based) of CHUNKS, and
    the chunks found to have run away so far."""

    audio: np.ndarray
    chunk: int = 1
    chunks: int = 1
    runaways: list[int] = field(default_factory=list)


class SpeechStream:
    """The chunks of one streamed job, handed from the worker thread to the event loop.

        stream = scheduler.stream(job, loop)
        async for delta in stream: ...      # Delta: audio and its chunk; errors raise ApiError
        stream.close()                      # the client left: the job stops at its next step
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_speech=None):
        self.task: _Task | None = None
        self.profile: SynthProfile | None = None
        self.result: SynthResult | None = None
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

