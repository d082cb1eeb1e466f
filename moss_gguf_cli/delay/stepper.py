"""The delay family's stepper for the one serve core (serve/stepper.py): requests as
delay/speech.Speech plans whose utterances join the batch engine (delay/engine.py: up to
max_batch utterances, one KV sequence each, stepped together) as sequences free up.

A new request's first chunk takes a free sequence first, then running requests' ready chunks
fill what is left, so one long text uses the width. A runaway chunk is run again (`retries`,
delay/speech.py). One LoRA adapter set runs at a time (adapters.py): a request asking for
another waits until the batch is done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import is_debug
from ..serve.api_errors import ApiError
from ..serve.stepper import Delta, Finished, ServedModel, SpeechJob, Watch
from ..tts.codec import FRAME_SAMPLES
from . import Speaker, Synthesizer, SynthResult
from .adapters import AdapterGate
from .engine import Utterance
from .speech import RETRIES, PromptTooLong, Speech
from .synthesizer import NoFrames

log = logging.getLogger(__name__)


@dataclass
class DelayJob(SpeechJob):
    """One request, as the stepper hands it to `Synthesizer.speech`."""

    instruction: str | None = None
    language: str | None = None  # a name of delay/language.py, checked by the request builder
    speakers: list[Speaker] | None = None  # MOSS-TTSD: a stored voice per speaker
    lora: dict[str, float] = field(default_factory=dict)  # adapter set (adapters.py)

    def options(self) -> dict[str, Any]:
        """Synthesizer.speech's keyword options."""
        return {"reference_codes": self.reference_codes, "instruction": self.instruction,
                "seed": self.seed, "max_new_tokens": self.max_new_tokens,
                "sampling": self.sampling or None, "language": self.language,
                "speakers": self.speakers}  # fmt: skip


class DelayStepper:
    """TTS's engine, its sequences shared by the running requests."""

    def __init__(self, tts: Synthesizer, retries: int = RETRIES):
        self.tts, self.retries = tts, retries  # retries: how often a runaway chunk runs again
        self.engine = tts.engine
        self.info = ServedModel(tts.info.variant, tts.info.n_vq, tts.info.sampling_rate, 1,
                                FRAME_SAMPLES)  # fmt: skip
        self.stepped = 0
        self._speeches: list[tuple[Speech, Any]] = []  # running requests, in order
        self._new: list[Speech] = []  # started since the last step: their first chunk first
        self._jobs: dict[int, tuple[Utterance, Speech, Any]] = {}  # id(utterance) → its job
        self._lora = AdapterGate(tts)  # one adapter set at a time

    @property
    def free(self) -> int:
        return len(self.engine.free)

    @property
    def busy(self) -> bool:
        return bool(self.engine.active) or any(sp.pending for sp, _ in self._speeches)

    @property
    def last_progress(self) -> float:
        return self.engine.last_progress

    def prepare(self, job: DelayJob) -> DelayJob:
        return job  # planned on the worker thread as it starts (the tokenizer is the model's)

    def admits(self, job: DelayJob, busy: bool) -> bool:
        running = busy or bool(self.engine.active or self._speeches)
        return self._lora.admits(job.lora, running)

    def start(self, task: Any, job: DelayJob, watch: Watch,
              on_audio: Callable[[Delta], None] | None) -> None:  # fmt: skip
        made: list[Speech] = []

        def streamed(audio: np.ndarray, index: int) -> None:
            speech = made[0]
            on_audio(Delta(audio, index + 1, len(speech.chunks), list(speech.runaways)))

        made.append(self.tts.speech(job.text, watch, on_audio=streamed if on_audio else None,
                                    retries=self.retries, share_first=True,
                                    **job.options()))  # fmt: skip
        self._speeches.append((made[0], task))
        self._new.append(made[0])

    def step(self) -> list[Finished]:
        engine, finished = self.engine, []
        self._join(finished)
        self.stepped = len(engine.active)
        try:
            ended = engine.step()
        except Exception as exc:  # noqa: BLE001 - a bug: never step the same rows again
            log.error("a generation step failed: %s", exc, exc_info=is_debug())
            for u in list(engine.active):
                engine.leave(u, exc)
            ended = [u for u, _, _ in self._jobs.values() if u.finished]
        for u in ended:
            _, speech, task = self._jobs.pop(id(u))
            speech.ended(u)
            if speech.done:
                finished.append(self._end(task, speech))
        return finished

    def stop(self, error: BaseException) -> None:
        for speech, _ in self._speeches:
            speech.abort(self.engine, error)
        self._speeches, self._new = [], []
        self._jobs.clear()

    def encode_voice(self, clip: Path) -> np.ndarray:
        return self.tts.encode_reference(clip)

    def explain(self, error: BaseException, job: DelayJob | None) -> ApiError | None:
        """This family's errors a request caused, naming the field to change."""
        if isinstance(error, PromptTooLong):
            return ApiError(400, f"input, instructions and voice together take {error.rows} "
                            f"positions, this server holds {error.n_ctx}; shorten input (or "
                            "instructions, or use a shorter voice)", param="input",
                            code="input_too_long")  # fmt: skip
        if isinstance(error, NoFrames) and job is not None and job.max_new_tokens is not None:
            return ApiError(400, f"max_new_tokens {job.max_new_tokens} ended the speech before "
                            "its first complete audio frame; raise max_new_tokens or leave it "
                            "out", param="max_new_tokens", code="invalid_value")  # fmt: skip
        return None

    def close(self) -> None:
        self.tts.close()

    # -- inside

    def _join(self, finished: list[Finished]) -> None:
        """Utterances into free sequences: each new request's first chunk, then the chunks
        that running requests have ready, request by request (a long text takes the width
        left)."""
        engine, new = self.engine, self._new
        firsts = [(sp, t) for sp, t in self._speeches if sp in new]
        self._new = []
        for limit, speeches in ((1, firsts), (None, list(self._speeches))):
            for speech, task in speeches:
                free = len(engine.free) if limit is None else min(limit, len(engine.free))
                try:
                    for u in speech.ready(free):
                        engine.join(u)
                        self._jobs[id(u)] = (u, speech, task)
                except Exception as exc:  # noqa: BLE001 - answered; the others go on
                    speech.error = speech.error or exc
                    finished.append(self._end(task, speech))

    def _end(self, task: Any, speech: Speech) -> Finished:
        """TASK's finished SPEECH taken out, as its value or its error."""
        self._speeches = [(sp, t) for sp, t in self._speeches if t is not task]
        for key in [k for k, (_, sp, _) in self._jobs.items() if sp is speech]:
            del self._jobs[key]
        try:
            if speech.error is not None:
                speech.abort(self.engine, speech.error)
                raise speech.error
            result: SynthResult = self.tts.speech_result(speech)
            return task, result, None
        except Exception as exc:  # noqa: BLE001 - answered; the worker goes on
            return task, None, exc
