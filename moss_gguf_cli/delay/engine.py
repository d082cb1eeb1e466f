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
With max_batch 1 this is the single-utterance loop of `synth`, bit for bit. With more, the
width policy (`EngineSettings`) says how wide a step is: "served", as wide as the rows being
served, so a lone utterance pays nothing for the width the server could use; "identical",
the same but never 1 row and llama.cpp's weights not repacked, so an utterance's greedy audio
does not depend on the others; "fixed", every product max_batch rows wide whoever is being
served (backbone.py, heads.py say why).

What a step reads (ARCHITECTURE.md §10): before the decode, each utterance's next plan says
which text ids it may pick (`StepPlan.text_ids`). Only when some row needs the whole
vocabulary does llama.cpp run its text head; otherwise the backbone stops at the hidden
state and `TextHead` (delay/text_head.py) gives the logits of those ids alone.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..hold_points import fail
from ..progress import ProgressReporter
from ..tts.backbone import Backbone
from ..tts.codec import FRAME_SAMPLES, SAMPLE_RATE
from ..tts.defaults import WIDTHS
from ..tts.sampling import Sampler
from .config import ModelInfo
from .embeddings import EmbeddingTables
from .heads import AudioHeads
from .pattern import DelayMachine, StepPlan
from .prompt import Prompt
from .text_head import TextHead


@dataclass(frozen=True)
class EngineSettings:
    """How the engine steps (chosen in `Synthesizer`, ARCHITECTURE.md §10).

    width, the batch's width policy:
      "served" (default): each step as wide as the utterances being served, llama.cpp's
        repacked weights: a lone utterance runs the 1-row kernels, as fast as on a 1-wide
        engine; an utterance's bits may depend on the batch around it (other kernels for
        n rows), so batched greedy audio can differ from the same request alone.
      "identical": as wide as served, the weights not repacked (their kernels give a row
        the same bits at any width: benchmarks/floor_width.py measures the cost), so
        greedy audio is the same alone or batched.
      "fixed": every step max_batch rows wide whoever is served (the way before): the same
        bits alone or batched, a lone utterance paying for the width.
    heads: the audio heads' backend (delay/heads.py); None: the config's heads_backend.
    text_head: False makes llama.cpp run its whole text head every step (the way before
    delay/text_head.py; for checks).
    shared_prefix: False prefills every prompt whole, also the beginnings that chunks 2..n
    of a request share (the way before; for checks)."""

    width: str = "served"
    heads: str | None = None
    text_head: bool = True
    shared_prefix: bool = True

    @property
    def repack(self) -> bool:
        return self.width != "identical"


@dataclass
class SynthProfile:
    """Where the time of one `generate` went (seconds unless named otherwise)."""

    prompt_rows: int = 0
    prefix_rows: int = 0  # of them, restored from another chunk's prefill (not computed)
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
    chunks: int = 1  # the request's chunks (delay/speech.py)
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
        self.plan: StepPlan | None = None  # the next step's, known before its decode
        self.logits = np.empty(0, dtype=np.float32)  # of plan.text_ids
        self.count = 0
        self.frames = 0
        self.finished = False
        self.error: BaseException | None = None
        # its prompt's rows before the text may come from the engine's kept beginning (one
        # like it prefilled before): delay/speech.py sets it for chunks 2..n, whose prompts
        # differ only in their text
        self.shares_prefix = False

    @property
    def runaway(self) -> bool:
        """It used its whole step budget without ending (delay/speech.py retries it)."""
        return (self.finished and self.error is None and self.count >= self.run.steps_allowed
                and not (self.machine is not None and self.machine.done))  # fmt: skip


class Engine:
    def __init__(self, backbone: Backbone, embeddings: EmbeddingTables, heads: AudioHeads,
                 info: ModelInfo, max_batch: int = 1, text_head: TextHead | None = None,
                 settings: EngineSettings | None = None):  # fmt: skip
        self.backbone, self.embeddings, self.heads, self.info = backbone, embeddings, heads, info
        self.settings = settings or EngineSettings()
        if self.settings.width not in WIDTHS:
            raise ValueError(f"width must be one of {', '.join(WIDTHS)}")
        self.text_head = text_head if self.settings.text_head else None
        self.width = max_batch
        width = self.settings.width
        self.fixed = width == "fixed" and max_batch > 1
        # "identical": never 1 row (the kernels for one row sum in other orders than those
        # for several, for F16/Q8_0 weights and heads); NumPy's heads only at a fixed width
        self.min_rows = 2 if width == "identical" and max_batch > 1 else 1
        self.heads_width = max_batch if self.fixed or (
            width == "identical" and heads.backend == "numpy") else 0  # fmt: skip
        self.free = list(range(max_batch))
        self.active: list[Utterance] = []
        # the beginning of the prompt last shared (its rows, llama.cpp's KV of them): the
        # chunks of one request that carry one voice prefill it once (Utterance.shares_prefix)
        self._prefix: tuple[np.ndarray, ctypes.Array] | None = None
        # monotonic time of the last finished step or prefill: a watchdog tells a long step
        # from a wedged engine by it (serve/scheduler.py, /health)
        self.last_progress = time.monotonic()

    def forget_prefix(self) -> None:
        """Drop the kept shared beginning: its KV was computed under other weights (another
        LoRA set, tts/lora.py), so no later chunk may restore it."""
        self._prefix = None

    def join(self, u: Utterance) -> None:
        """Prefill U's prompt into a free sequence; it takes part from the next step."""
        if not self.free:
            raise RuntimeError("no free sequence: check `free` before joining")
        u.seq = self.free.pop(0)
        profile = u.run.profile
        try:
            self.backbone.reset(u.seq)
            u.machine = DelayMachine(self.info, u.run.prompt.rows)
            u.plan = u.machine.plan()
            t0 = time.perf_counter()
            rows = u.run.prompt.rows
            start = 0
            if u.shares_prefix and self.settings.shared_prefix:
                start, restored = self._prefix_into(u)
                profile.prefix_rows = start if restored else 0
            hidden, logits = self.backbone.prefill(
                self.embeddings.sum_rows(rows[start:]), seq=u.seq,
                logits=self._whole_vocabulary([u.plan]),
            )  # fmt: skip
            u.hidden = hidden.copy()
            self._take_text([u], hidden[None], None if logits is None else logits[None])
            profile.prefill_s = time.perf_counter() - t0
            self.last_progress = time.monotonic()
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
                plan = u.plan  # made before the decode: it said which text logits to make
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
                width = self.heads_width or max(self.min_rows, len(sampling))
                logits = self.heads.logits_rows(hidden, width)
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
            for u, _row in going:
                u.plan = u.machine.plan()
            t1 = time.perf_counter()
            fail("decode")  # a test's injected failure of the shared decode
            hidden, logits = self.backbone.step_many(
                embeds, [u.seq for u, _ in going], logits=self._whole_vocabulary(
                    [u.plan for u, _ in going]), fixed=self.fixed, min_width=self.min_rows,
            )  # fmt: skip
            t2 = time.perf_counter()
            users = [u for u, _ in going]
            for i, u in enumerate(users):
                u.hidden = hidden[i].copy()
            self._take_text(users, hidden, logits)
        except Exception as exc:  # noqa: BLE001 - every utterance of the batch fails with it
            for u, _ in going:
                self.leave(u, exc)
            return [u for u, _ in going]
        t3 = time.perf_counter()
        for u in users:
            u.run.profile.embed_s += t1 - t0
            u.run.profile.backbone_s += t2 - t1
            u.run.profile.heads_s += t3 - t2
        return []

    def _prefix_into(self, u: Utterance) -> tuple[int, bool]:
        """U's sequence holds its prompt's shared beginning (restored when the kept one is
        the same rows, else prefilled and kept): how many rows that is, whether restored."""
        shared = u.run.prompt.rows[: u.run.prompt.shared_rows]
        if not shared.shape[0]:
            return 0, False
        kept = self._prefix
        if kept is not None and np.array_equal(kept[0], shared):
            self.backbone.load(u.seq, kept[1], shared.shape[0])
            return int(shared.shape[0]), True
        self.backbone.fill(self.embeddings.sum_rows(shared), seq=u.seq)
        self._prefix = (shared.copy(), self.backbone.save(u.seq))
        return int(shared.shape[0]), False

    def _whole_vocabulary(self, plans: list[StepPlan]) -> bool:
        """Whether llama.cpp must run its text head for this decode."""
        return self.text_head is None or any(p.text_ids is None for p in plans)

    def _take_text(self, users: list[Utterance], hidden: np.ndarray,
                   logits: np.ndarray | None) -> None:  # fmt: skip
        """Each utterance's text logits of its plan's ids: from llama.cpp's whole head when
        it ran, else from the text head's product over the union of the ids asked for."""
        if logits is not None:
            for i, u in enumerate(users):
                ids = u.plan.text_ids
                u.logits = logits[i].copy() if ids is None else logits[i][ids]
            return
        assert self.text_head is not None
        wanted = [i for i, u in enumerate(users) if u.plan.text_ids.size]
        for u in users:
            u.logits = np.empty(0, dtype=np.float32)
        if not wanted:
            return
        ids = np.unique(np.concatenate([users[i].plan.text_ids for i in wanted]))
        # as wide as the batch llama.cpp decoded: its head would have been that wide
        product = self.text_head.logits(hidden[wanted], ids, width=self.backbone.width)
        for row, i in enumerate(wanted):
            users[i].logits = product[row, np.searchsorted(ids, users[i].plan.text_ids)]

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
