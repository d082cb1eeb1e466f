"""The generation engine: utterances stepped together, one backbone row each per step.

    engine = Engine(backbone, embeddings, heads, info, max_batch=4)
    engine.join(Utterance(run, progress, on_row))   # prefill into a free KV sequence
    ended = engine.step()                           # every utterance one row further

Utterances join (prefill into a free sequence) and leave (their sequence cleared) between
steps. A step: the delay machines choose the text ids, the audio heads run for every row that
samples codes in one matrix product, each utterance takes its row (`on_row`; its progress
reporter may stop it: a client gone), then the rows of those going on are summed into
embeddings and decoded in one llama_batch (Backbone.step_many). Failure is per row
(docs/ARCHITECTURE.md §10): a step never raises; whoever failed ends with `error` set.
With max_batch 1 this is the single-utterance loop of `synth`, bit for bit. With more,
every product is max_batch rows wide whoever is being served (backbone.py, heads.py say
why), so an utterance's greedy audio does not depend on the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..hold_points import fail
from ..progress import ProgressReporter
from .backbone import Backbone
from .codec import FRAME_SAMPLES, SAMPLE_RATE
from .config import ModelInfo
from .delay import DelayMachine, StepPlan
from .embeddings import EmbeddingTables
from .heads import AudioHeads
from .prompt import Prompt
from .sampling import Sampler


@dataclass
class SynthProfile:
    """Where the time of one `generate` went (seconds unless named otherwise)."""

    prompt_rows: int = 0
    reference_frames: int = 0
    steps: int = 0
    frames: int = 0
    segments: int = 0
    stopped: bool = False  # the model ended with <|im_end|> (else max_new_tokens/n_ctx)
    reference_s: float = 0.0
    prefill_s: float = 0.0
    embed_s: float = 0.0
    backbone_s: float = 0.0
    heads_s: float = 0.0
    sampling_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    heads_backend: str = ""
    chunks: int = 1  # the request's chunks (tts/speech.py)
    runaways: int = 0  # chunks that ran away, retry included

    @property
    def audio_s(self) -> float:
        return self.frames * FRAME_SAMPLES / SAMPLE_RATE

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_rows / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def steps_per_s(self) -> float:
        loop = self.embed_s + self.backbone_s + self.heads_s + self.sampling_s
        return self.steps / loop if loop > 0 else 0.0

    def per_step_ms(self, part: str) -> float:
        return 1000.0 * getattr(self, f"{part}_s") / self.steps if self.steps else 0.0

    @property
    def real_time_factor(self) -> float:
        """Wall time / audio time: below 1 is faster than real time."""
        return self.total_s / self.audio_s if self.audio_s > 0 else float("inf")


@dataclass
class Run:
    """What one utterance starts from: its prompt, step budget, sampler and profile."""

    prompt: Prompt
    steps_allowed: int
    sampler: Sampler
    profile: SynthProfile
    t_start: float


class Utterance:
    """One utterance in the engine. ON_ROW takes each generated row (1 + n_vq ids)."""

    def __init__(self, run: Run, progress: ProgressReporter, on_row: Callable[[np.ndarray], None]):
        self.run, self.progress, self.on_row = run, progress, on_row
        self.machine: DelayMachine | None = None  # made on joining
        self.seq = -1
        self.hidden = np.empty(0, dtype=np.float32)
        self.logits = np.empty(0, dtype=np.float32)
        self.count = 0
        self.frames = 0
        self.finished = False
        self.error: BaseException | None = None

    @property
    def runaway(self) -> bool:
        """It used its whole step budget without ending (tts/speech.py retries it)."""
        return (self.finished and self.error is None and self.count >= self.run.steps_allowed
                and not (self.machine is not None and self.machine.done))  # fmt: skip


class Engine:
    def __init__(self, backbone: Backbone, embeddings: EmbeddingTables, heads: AudioHeads,
                 info: ModelInfo, max_batch: int = 1):  # fmt: skip
        self.backbone, self.embeddings, self.heads, self.info = backbone, embeddings, heads, info
        self.width = max_batch
        self.free = list(range(max_batch))
        self.active: list[Utterance] = []
        # monotonic time of the last finished step or prefill: a watchdog tells a long step
        # from a wedged engine by it (serve/scheduler.py, /health)
        self.last_progress = time.monotonic()

    def join(self, u: Utterance) -> None:
        """Prefill U's prompt into a free sequence; it takes part from the next step."""
        if not self.free:
            raise RuntimeError("no free sequence: check `free` before joining")
        u.seq = self.free.pop(0)
        profile = u.run.profile
        try:
            self.backbone.reset(u.seq)
            u.machine = DelayMachine(self.info, u.run.prompt.rows)
            t0 = time.perf_counter()
            hidden, logits = self.backbone.prefill(
                self.embeddings.sum_rows(u.run.prompt.rows), seq=u.seq
            )
            profile.prefill_s = time.perf_counter() - t0
            self.last_progress = time.monotonic()
            u.hidden, u.logits = hidden.copy(), logits.copy()
        except BaseException:
            self._release(u)
            raise
        u.progress.start("synth", "generating", total=u.run.steps_allowed, unit="steps")
        self.active.append(u)

    def leave(self, u: Utterance, error: BaseException | None = None) -> None:
        """Take U out now (its sequence freed), e.g. when the server stops."""
        if u in self.active:
            self.active.remove(u)
        if not u.finished:
            u.error = u.error or error
            self._end(u)

    def step(self) -> list[Utterance]:
        """Every active utterance one row further; the utterances that ended in this step
        (finished, stopped by their progress reporter, or failed: see `error`).

        Never raises for a failure: one utterance's own (its sampler, its `on_row`) ends that
        utterance alone; one of the shared work (the audio heads, the backbone decode) ends
        the utterances it was for, their sequences cleared, and the engine stays usable."""
        if not self.active:
            return []
        clock = time.perf_counter
        t0 = clock()
        rows, plans, t_heads = self._rows(self.active)
        t1 = clock()
        ended, going = [], []
        for u, row, plan in zip(self.active, rows, plans, strict=True):
            u.count += 1
            u.run.profile.heads_s += t_heads
            u.run.profile.sampling_s += t1 - t0 - t_heads
            if u.error is None:
                self._take(u, row, plan)
            done = u.error is not None or u.machine.done or u.count == u.run.steps_allowed
            (ended if done else going).append((u, row))
        self.active = [u for u, _ in going]
        for u, _ in ended:
            self._end(u)
        failed = self._decode(going) if going else []
        self.last_progress = time.monotonic()
        return [u for u, _ in ended] + failed

    # -- inside

    def _take(self, u: Utterance, row: np.ndarray, plan: StepPlan) -> None:
        """U takes its row; a failure (its client gone, its consumer broken) is U's alone."""
        try:
            fail("row")  # a test's injected failure of one utterance
            u.on_row(row)
            if plan.audio_start == 0 and plan.audio_stop > 0:
                u.frames += 1  # codebook 0 sampled: a new frame begins
            seconds = u.frames * FRAME_SAMPLES / SAMPLE_RATE
            u.progress.advance("synth", 1, description=f"generating: {u.frames} frames, "
                               f"{seconds:.2f} s of audio")  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - the utterance's own failure
            u.error = exc

    def _rows(self, batch: list[Utterance]) -> tuple[list, list, float]:
        """Each utterance's row of this step (None where it failed: `error` set); the heads'
        time. A sampler's failure is its utterance's; the heads' fails those that needed them."""
        plans: list[StepPlan | None] = []
        texts: list[int | None] = []
        for u in batch:
            try:
                plan = u.machine.plan()
                text = u.machine.choose_text(u.logits, u.run.sampler, plan)
            except Exception as exc:  # noqa: BLE001 - this utterance's own failure
                u.error, plan, text = exc, None, None
            plans.append(plan)
            texts.append(text)
        sampling = [i for i, p in enumerate(plans) if p is not None and p.needs_audio]
        t0 = time.perf_counter()
        logits = None
        if sampling:
            try:
                hidden = np.stack([batch[i].hidden for i in sampling])
                logits = self.heads.logits_rows(hidden, self.width)
            except Exception as exc:  # noqa: BLE001 - shared: every row that needed them
                for i in sampling:
                    batch[i].error = exc
        t_heads = time.perf_counter() - t0
        rows: list[np.ndarray | None] = []
        for i, (u, plan, text) in enumerate(zip(batch, plans, texts, strict=True)):
            if u.error is not None:
                rows.append(None)
                continue
            try:
                codes = None
                if plan.needs_audio:
                    audio = logits[sampling.index(i)][plan.audio_start : plan.audio_stop]
                    codes = u.machine.choose_audio(audio, u.run.sampler, plan)
                rows.append(u.machine.advance(text, codes, plan))
            except Exception as exc:  # noqa: BLE001 - this utterance's own failure
                u.error = exc
                rows.append(None)
        return rows, plans, t_heads

    def _decode(self, going: list[tuple[Utterance, np.ndarray]]) -> list[Utterance]:
        """The going rows decoded into their next hidden states; if the shared decode fails,
        every utterance of the batch ends with its error (returned), sequences cleared."""
        t0 = time.perf_counter()
        try:
            embeds = np.empty((len(going), self.embeddings.hidden), dtype=np.float32)
            for i, (_u, row) in enumerate(going):
                self.embeddings.sum_row(row, embeds[i])
            t1 = time.perf_counter()
            fail("decode")  # a test's injected failure of the shared decode
            hidden, logits = self.backbone.step_many(embeds, [u.seq for u, _ in going])
        except Exception as exc:  # noqa: BLE001 - every utterance of the batch fails with it
            for u, _ in going:
                self.leave(u, exc)
            return [u for u, _ in going]
        t2 = time.perf_counter()
        for i, (u, _row) in enumerate(going):
            u.hidden, u.logits = hidden[i].copy(), logits[i].copy()
            u.run.profile.embed_s += t1 - t0
            u.run.profile.backbone_s += t2 - t1
        return []

    def _end(self, u: Utterance) -> None:
        u.finished = True
        u.run.profile.steps = u.count
        u.run.profile.stopped = u.machine is not None and u.machine.done
        u.progress.finish("synth")
        self._release(u)

    def _release(self, u: Utterance) -> None:
        if u.seq >= 0:
            self.backbone.reset(u.seq)
            self.free.append(u.seq)
            self.free.sort()
            u.seq = -1
