"""The delay pattern: applying and undoing it; the generation state machine (ARCHITECTURE.md §5).

In the delay pattern codebook k of frame t sits on row t + k, so T frames span
T + n_vq − 1 rows. Generation emits one row per step: a text id (column 0) and
n_vq audio codes; `DelayMachine` decides which of them are forced, masked or
sampled from the state (audio_length, delayed_length, is_audio, is_stopping,
time_step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..tts.sampling import Sampler
from .config import ModelInfo


def apply_delay(codes: np.ndarray, pad_code: int) -> np.ndarray:
    """(T, n_vq) frames → (T + n_vq − 1, n_vq) rows, codebook k shifted down by k rows."""
    frames, n_vq = codes.shape
    rows = np.full((frames + n_vq - 1, n_vq), pad_code, dtype=np.int64)
    for k in range(n_vq):
        rows[k : k + frames, k] = codes[:, k]
    return rows


def undo_delay(rows: np.ndarray, pad_code: int) -> np.ndarray:
    """(R, n_vq) delayed rows → (R − n_vq + 1, n_vq) frames: codebook k read k rows later."""
    count, n_vq = rows.shape
    frames = count - n_vq + 1
    if frames <= 0:
        return np.empty((0, n_vq), dtype=np.int64)
    codes = np.empty((frames, n_vq), dtype=np.int64)
    for k in range(n_vq):
        codes[:, k] = rows[k : k + frames, k]
    return codes


def split_segments(codes: np.ndarray, pad_code: int) -> list[np.ndarray]:
    """Drop all-pad frames and split what is left into runs of consecutive frames."""
    keep = np.flatnonzero(~np.all(codes == pad_code, axis=1))
    if keep.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(keep) != 1) + 1
    return [codes[run] for run in np.split(keep, breaks)]


@dataclass
class DelayState:
    audio_length: int = 0
    delayed_length: int | None = None  # None: no delay slot emitted yet (∞)
    is_audio: bool = False
    is_stopping: bool = False
    time_step: int = 0


NO_TEXT_IDS = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class StepPlan:
    """What the next step needs: a forced text id or a sampling mode, which codebooks, and
    which text logits (`text_ids`: the ids whose logits `choose_text` takes, in that order;
    empty when the text id needs none; None for the whole vocabulary)."""

    forced_text: int | None
    audio_start: int  # codebooks [audio_start, audio_stop) are sampled
    audio_stop: int
    text_ids: np.ndarray | None = field(compare=False)

    @property
    def needs_audio(self) -> bool:
        return self.audio_stop > self.audio_start


class DelayMachine:
    """Batch-1 delay-pattern generation, one row per `step`."""

    def __init__(self, info: ModelInfo, prompt_rows: np.ndarray):
        self.info = info
        self.n_vq = info.n_vq
        self.pad = info.audio_pad_code
        text = prompt_rows[:, 0]
        self.state = DelayState()
        # a prompt ending in audio-start (or a gen slot) continues inside audio:
        # audio_length counts the rows since the last audio-start, that row included
        if text.size and int(text[-1]) in (
            info.audio_start_token_id,
            info.audio_assistant_gen_slot_token_id,
        ):
            starts = np.flatnonzero(text == info.audio_start_token_id)
            if starts.size:
                self.state.audio_length = int(text.size - starts[-1])
                self.state.is_audio = True
        # per-codebook history for the repetition penalty: the prompt's codes included
        self.seen = np.zeros((self.n_vq, info.audio_rows), dtype=bool)
        audio = prompt_rows[:, 1:]
        for k in range(self.n_vq):
            self.seen[k, np.unique(audio[:, k])] = True
        self._audio_ids = np.array(
            [info.audio_assistant_gen_slot_token_id, info.audio_assistant_delay_slot_token_id],
            dtype=np.int64,
        )
        self._banned_outside = np.array(
            [
                info.pad_token_id,
                info.audio_assistant_gen_slot_token_id,
                info.audio_assistant_delay_slot_token_id,
                info.audio_end_token_id,
            ],
            dtype=np.int64,
        )

    @property
    def done(self) -> bool:
        return self.state.is_stopping

    def plan(self) -> StepPlan:
        st = self.state
        forced = None
        if st.delayed_length is not None and st.delayed_length < self.n_vq:
            forced = self.info.audio_assistant_delay_slot_token_id
        elif st.delayed_length == self.n_vq:
            forced = self.info.audio_end_token_id
        start = 0 if st.delayed_length is None else st.delayed_length
        stop = min(st.audio_length, self.n_vq)
        return StepPlan(forced, start, max(start, stop), self._text_ids(forced))

    def _text_ids(self, forced: int | None) -> np.ndarray | None:
        """Which text logits the step reads: none when the id is forced, or when inside
        audio at step 0 (the gen slot is the one candidate left); the gen and delay slots
        inside audio (upstream's `_AUDIO_ALLOWED_IDS`); else the whole vocabulary."""
        if forced is not None or (self.state.is_audio and self.state.time_step == 0):
            return NO_TEXT_IDS
        return self._audio_ids if self.state.is_audio else None

    def choose_text(self, logits: np.ndarray, sampler: Sampler, plan: StepPlan) -> int:
        """The text id of this step from the logits of `plan.text_ids` (the whole
        vocabulary when None); `logits` may be a view of the backbone's buffer."""
        if plan.forced_text is not None:
            return plan.forced_text
        info, st = self.info, self.state
        gen, delay = self._audio_ids
        if st.is_audio:
            # inside audio only gen-slot / delay-slot are allowed: sampling over these
            # two values equals sampling the full vector with everything else at -inf
            if st.time_step == 0:
                return gen  # delay-slot is forbidden at step 0: one candidate left
            pair = np.array(logits[:2], dtype=np.float32)  # the logits of (gen, delay)
            return (int(gen), int(delay))[sampler.text(pair)]
        masked = np.array(logits, dtype=np.float32, copy=True)
        masked[self._banned_outside] = -np.inf
        if st.time_step == 0:
            masked[delay] = -np.inf
        if st.time_step <= self.n_vq:
            masked[info.im_end_token_id] = -np.inf
        return sampler.text(masked)

    def choose_audio(self, logits: np.ndarray, sampler: Sampler, plan: StepPlan) -> np.ndarray:
        """Codes of codebooks plan.audio_start..stop from their (stop − start, V) logits."""
        logits[:, self.pad] = -np.inf  # the pad code is never sampled
        if sampler.audio_params.repetition_penalty == 1.0:
            return sampler.audio(logits, None)
        return sampler.audio(logits, penalty_history(self.seen, plan.audio_start, plan.audio_stop))

    def advance(self, text: int, codes: np.ndarray | None, plan: StepPlan) -> np.ndarray:
        """Record this step's choices; returns the row (1 + n_vq,) fed back to the model."""
        info, st = self.info, self.state
        row = np.full(1 + self.n_vq, self.pad, dtype=np.int64)
        row[0] = text
        if codes is not None and plan.needs_audio:
            row[1 + plan.audio_start : 1 + plan.audio_stop] = codes
            self.seen[np.arange(plan.audio_start, plan.audio_stop), codes] = True
        gen, delay = (
            info.audio_assistant_gen_slot_token_id,
            info.audio_assistant_delay_slot_token_id,
        )
        if text == info.audio_start_token_id:
            st.is_audio = True
        if text in (info.audio_start_token_id, gen, delay):
            st.audio_length += 1
        if text == info.audio_end_token_id:
            st.audio_length = 0
            st.is_audio = False
        if st.delayed_length is None and text == delay:
            st.delayed_length = 0
        if st.delayed_length is not None:
            st.delayed_length += 1
            if st.delayed_length > self.n_vq:
                st.delayed_length = None
        if text == info.im_end_token_id:
            st.is_stopping = True
        st.time_step += 1
        return row

    def step(
        self,
        text_logits: np.ndarray,
        audio_logits: Callable[[int, int], np.ndarray] | np.ndarray,
        sampler: Sampler,
    ) -> np.ndarray:
        """One whole step from the whole vocabulary's TEXT_LOGITS. `audio_logits(start, stop)`
        gives those codebooks' logits
        (or pass the full (n_vq, V) array); it is only called when codes are sampled."""
        plan = self.plan()
        if plan.text_ids is not None:
            text_logits = text_logits[plan.text_ids]
        text = self.choose_text(text_logits, sampler, plan)
        codes = None
        if plan.needs_audio:
            if callable(audio_logits):
                rows = audio_logits(plan.audio_start, plan.audio_stop)
            else:
                rows = np.array(audio_logits[plan.audio_start : plan.audio_stop], dtype=np.float32)
            codes = self.choose_audio(rows, sampler, plan)
        return self.advance(text, codes, plan)


def generated_segments(rows: np.ndarray, info: ModelInfo) -> list[np.ndarray]:
    """Generated rows (G, 1 + n_vq) → the audio segments, each (T, n_vq) frames."""
    if rows.shape[0] == 0:
        return []
    return split_segments(undo_delay(rows[:, 1:], info.audio_pad_code), info.audio_pad_code)


def penalty_history(seen: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Which codes the repetition penalty hits, per codebook sampled this step.

    As upstream's backend: codebook 0 by its own history; the other codebooks of the step
    all by the union of their histories (prompt codes included).
    """
    out = np.empty((stop - start, seen.shape[1]), dtype=bool)
    first = 1 if start == 0 else start
    if start == 0:
        out[0] = seen[0]
    if stop > first:
        out[first - start :] = seen[first:stop].any(axis=0)
    return out
