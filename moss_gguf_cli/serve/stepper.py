"""What a model family gives the one serve core: a Stepper (docs/ARCHITECTURE.md §9).

The Scheduler (scheduler.py) owns the queue, the worker thread, the watchdog, shutdown and
the gauges, and never asks which family it holds; a family's stepper speaks its requests:

    prepared = stepper.prepare(job)        # on the route's thread: a 400 before any work
    stepper.start(task, prepared, watch, on_audio)       # on the worker, when it may start
    for task, value, error in stepper.step(): ...        # every running request, one step

A request's `Watch` is its cancellation point: the stepper calls `frame()` once a frame (or
hands it on as a progress reporter), and it raises `Cancelled` once the client left or the
server stops, so the request ends at its next step and frees its room.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..hold_points import hold
from ..progress import NullProgress
from .api_errors import ApiError
from .failures import Cancelled


@dataclass(frozen=True)
class ServedModel:
    """What the routes, the start line and the voice store read of the served model."""

    variant: str  # the name the start line says (MOSS-TTS, MOSS-TTS-Nano, …)
    n_vq: int  # codebooks a voice's codes have
    sample_rate: int
    channels: int
    frame_samples: int  # samples an audio frame holds

    @property
    def frame_s(self) -> float:
        return self.frame_samples / self.sample_rate


@dataclass
class SpeechJob:
    """What every family's request builder takes from OpenAI's fields; a family's job adds
    its own (the delay family's language and speakers, Nano's min_new_tokens)."""

    text: str
    reference_codes: np.ndarray | None = None  # a stored voice's
    seed: int | None = None
    max_new_tokens: int | None = None
    sampling: dict[str, float] = field(default_factory=dict)  # the keys the request set


@dataclass(frozen=True)
class Delta:
    """A piece of streamed audio: float32 samples of chunk CHUNK (1-based) of CHUNKS, and
    the chunks found to have run away so far."""

    audio: np.ndarray
    chunk: int = 1
    chunks: int = 1
    runaways: list[int] = field(default_factory=list)


class Watch(NullProgress):
    """A request's cancellation point (a progress reporter, for a stepper that reports)."""

    def __init__(self, cancel: threading.Event):
        self._cancel = cancel

    def frame(self) -> None:
        """A frame is made: a test's fixed point, and the request ends if it is unwanted."""
        hold("serve")  # a test's fixed point: a request is generating
        if self._cancel.is_set():
            raise Cancelled()

    def advance(self, key: str, amount: float = 1, description: str | None = None) -> None:
        if key == "synth":
            self.frame()
        elif self._cancel.is_set():
            raise Cancelled()


# (the task start() was given, its value, its error): a request that ended this step
Finished = tuple[Any, Any, BaseException | None]


class Stepper(Protocol):
    """A family's speaking side, driven by the one worker thread (never thread-safe)."""

    info: ServedModel

    @property
    def free(self) -> int:
        """Requests that could start now (free KV sequences, free engines)."""
        ...

    @property
    def busy(self) -> bool:
        """Whether a started request has work left for `step`."""
        ...

    @property
    def stepped(self) -> int:
        """Rows the last step advanced together (the batch gauges)."""
        ...

    @property
    def last_progress(self) -> float:
        """time.monotonic() of its last finished step or prefill (the watchdog reads it)."""
        ...

    def prepare(self, job: Any) -> Any:
        """JOB checked as it comes (ApiError, or a core error failures.api_error answers)."""
        ...

    def admits(self, prepared: Any, busy: bool) -> bool:
        """Whether PREPARED may start beside what runs; BUSY: something was just started."""
        ...

    def start(self, task: Any, prepared: Any, watch: Watch,
              on_audio: Callable[[Delta], None] | None) -> None:  # fmt: skip
        """Begin PREPARED for TASK (ON_AUDIO: streamed, the pieces in order); raises if it
        cannot begin."""
        ...

    def step(self) -> list[Finished]:
        """Every running request one step on; the tasks that ended, with value or error."""
        ...

    def stop(self, error: BaseException) -> None:
        """End every running request with ERROR (the server stops)."""
        ...

    def encode_voice(self, clip: Path) -> np.ndarray:
        """A reference clip's codes (frames, n_vq), between two steps."""
        ...

    def explain(self, error: BaseException, job: Any) -> ApiError | None:
        """The family's own answer to ERROR (a request too long, …); None: the core's."""
        ...

    def close(self) -> None: ...


@dataclass
class SpeechProfile:
    """A finished request's figures, named as the metrics and the SSE usage read them (the
    turn-taking families' results carry one; the delay family's has its own, richer)."""

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


WAITING = object()  # what a turn's step yields when it made nothing: it waits on its client


@dataclass(eq=False)
class Turn:
    """A running request of a turn-taking stepper: its engine and the generator that speaks
    it a frame a step (its return value the result)."""

    task: Any
    engine: Any
    steps: Generator[None, None, Any]


class TurnTaking:
    """The Stepper of a family whose engines each speak one request (one KV sequence): as many
    at once as ENGINES, every running request stepped a frame in turn on the core's one worker
    (MOSS-TTS-Nano, MOSS-TTS-Realtime). A family gives `info`, `prepare`, `encode_voice`,
    `explain` and `speech(engine, prepared, watch, on_audio)`: the generator of one request,
    which yields after each frame, or WAITING when it waits on its client (text still to
    come): a step where every request waits rests in `idle` instead of spinning."""

    def __init__(self, engines: list[Any]):
        self.engines = engines
        self.stepped = 0
        self.last_progress = time.monotonic()
        self._free = list(engines)
        self._turns: list[Turn] = []

    def speech(self, engine: Any, prepared: Any, watch: Watch,
               on_audio: Callable[[Delta], None] | None) -> Generator[None, None, Any]:  # fmt: skip
        raise NotImplementedError

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def busy(self) -> bool:
        return bool(self._turns)

    def admits(self, prepared: Any, busy: bool) -> bool:
        return True  # any request may run beside another

    def start(self, task: Any, prepared: Any, watch: Watch,
              on_audio: Callable[[Delta], None] | None) -> None:  # fmt: skip
        engine = self._free.pop(0)
        self._turns.append(Turn(task, engine, self.speech(engine, prepared, watch, on_audio)))

    def step(self) -> list[Finished]:
        finished: list[Finished] = []
        self.stepped = len(self._turns)
        idle = bool(self._turns)  # every running request waited on its client this step
        for turn in list(self._turns):
            try:
                if next(turn.steps) is not WAITING:
                    idle = False
                continue
            except StopIteration as done:
                finished.append((turn.task, done.value, None))
            except BaseException as exc:  # noqa: BLE001 - every failure answers its request
                finished.append((turn.task, None, exc))
            idle = False
            self._turns.remove(turn)
            # the engine freed last speaks next: a lone client's voice finds its shared
            # prompt rows kept there (each engine keeps its own)
            self._free.insert(0, turn.engine)
        if idle:
            self.idle()
        return finished

    def idle(self) -> None:
        """Every running request waits on its client's text: rest until one sends (a family
        whose requests wait overrides this with a wake-up; this sleeps briefly)."""
        time.sleep(0.005)

    def stop(self, error: BaseException) -> None:
        for turn in self._turns:
            turn.steps.close()  # the engines' locks let go
            self._free.insert(0, turn.engine)
        self._turns = []

    def progressed(self) -> None:
        """A frame was made (the watchdog's sign of life)."""
        self.last_progress = time.monotonic()

    def close(self) -> None:
        for engine in self.engines:
            engine.close()
