"""A whole request spoken in chunks, in one voice: the plan and the driver (ARCHITECTURE §10).

    plan = plan_speech(tokenizer, info, text, PlanLimits(n_ctx, cap), fields...)
    speech = Speech(tts, plan, options)         # tts: a Synthesizer
    while not speech.done:
        for u in speech.ready(len(engine.free)): engine.join(u)
        for u in engine.step(): speech.ended(u)
    result = speech.result()

The engine steps utterances and knows nothing of chunks. Here: the normalised text is split
(delay/chunking.py), each chunk gets its own prompt and step budget; chunk 1 joins first, and
the others join as rows beside it once the voice they carry exists: the caller's reference
from the start, else chunk 1's own codes (its first `VOICE_FRAMES`) as their reference, so
chunks 2..n run side by side after chunk 1 (docs/long-text.md says why not upstream's
continuation prefix). A chunk that reaches its own budget without ending has run away: it is
run once more with another seed, and reported if it runs away again (a chunk cut by the
caller's max_new_tokens or by n_ctx is reported as cut, not retried: a retry would be cut
too). Audio comes out in chunk order: the chunks joined by a pause of `PAUSE_FRAMES` with a
`FADE_SAMPLES` fade either side, so no join clicks; streamed, the head chunk's windows go out
as they are made (held back by the fade's length) and later chunks' are kept until their turn.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from ..progress import ProgressReporter
from ..tts.codec import FRAME_SAMPLES, loudness_gain, loudness_normalize
from .chunking import ChunkSettings, Piece, split_further, split_text, step_budget
from .config import ModelInfo
from .engine import Run, SynthProfile, Utterance
from .prompt import Prompt, PromptFields, build_prompt

VOICE_FRAMES = 250  # the voice chunks 2..n carry: chunk 1's first 20 s (upstream: 5-20 s clips)
PAUSE_FRAMES = 3  # 0.24 s of silence between chunks (upstream's Nano: 0.24-0.40 s)
FADE_SAMPLES = 480  # 20 ms raised-cosine fade out and in at every join
RETRIES = 1  # a runaway chunk is run once more with another seed
_SEED_STRIDE = 1_000_003  # a retry's seed: far from every chunk's first seed


class PromptTooLong(InputError):
    """The prompt (text, instruction, reference voice) does not fit the context (n_ctx)."""

    def __init__(self, rows: int, n_ctx: int):
        super().__init__(f"the prompt is {rows} rows but n_ctx is {n_ctx}",
                         hint="raise n_ctx in the config, or shorten the text / reference")
        self.rows, self.n_ctx = rows, n_ctx


@dataclass(frozen=True)
class PlanLimits:
    """What bounds a chunk: the context, the caller's max_new_tokens (caps every chunk)."""

    n_ctx: int
    max_new_tokens: int
    settings: ChunkSettings = field(default_factory=ChunkSettings)


@dataclass(frozen=True)
class ChunkPlan:
    index: int  # 0-based
    text: str  # as the model gets it (normalised)
    gap: str  # the spaces between it and the next chunk in the normalised text
    language: str | None  # as it goes into the prompt
    frames: float  # upstream's estimate
    budget: int  # steps it may take
    capped: bool  # the budget is max_new_tokens' or n_ctx's, not the estimate's
    prompt_rows: int  # with the voice it carries (chunks 2..n: VOICE_FRAMES at most)


@dataclass(frozen=True)
class SpeechPlan:
    text: str  # the normalised input
    chunks: list[ChunkPlan]
    voice: str  # "reference": the caller's; "chunk 1": chunk 1's codes; "none": one chunk

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "voice": self.voice, "voice_frames_max": VOICE_FRAMES,
                "pause_s": PAUSE_FRAMES * FRAME_SAMPLES / 24000,
                "chunks": [{"index": c.index + 1, "text": c.text, "language": c.language,
                            "chars": len(c.text), "estimated_frames": round(c.frames, 1),
                            "budget_steps": c.budget, "capped": c.capped,
                            "prompt_rows": c.prompt_rows} for c in self.chunks]}  # fmt: skip


@dataclass
class ChunkReport:
    """How one chunk went (synth --profile lists them)."""

    index: int
    chars: int
    budget: int
    steps: int = 0
    frames: int = 0
    ended: str = ""  # "end" (the model said so), "runaway", "cut" (max_new_tokens / n_ctx)
    tries: int = 0
    prompt: Prompt | None = None  # the last try's prompt (its voice rows: tests)
    codes: np.ndarray | None = None  # the frames it made (T, n_vq)


def plan_speech(tokenizer, info: ModelInfo, text: str, limits: PlanLimits,
                fields: PromptFields, voice_frames: int | None,
                normalize: Callable[[str], str] | None) -> SpeechPlan:  # fmt: skip
    """TEXT's chunks with their prompts measured. FIELDS: the prompt's other fields (its
    text is replaced); VOICE_FRAMES: the caller's reference length, None for none."""
    whole = normalize(text) if normalize else text
    if not whole.strip():
        raise InputError("the text to speak is empty", hint="pass --text or --text-file")
    pieces = split_text(whole, limits.settings)
    voice = "reference" if voice_frames else ("chunk 1" if len(pieces) > 1 else "none")
    chunks: list[ChunkPlan] = []
    queue = list(pieces)
    while queue:
        piece = queue.pop(0)
        first = not chunks
        frames = voice_frames or (0 if first else _carried_frames(chunks[0]))
        chunk = _measure(tokenizer, info, piece, len(chunks), limits, fields, frames)
        need = chunk.prompt_rows + min(step_budget(piece.frames, limits.settings, info.n_vq),
                                       limits.max_new_tokens)  # fmt: skip
        if need > limits.n_ctx:  # split further rather than cut it or refuse it
            parts = split_further(piece, math.ceil(need / limits.n_ctx) + 1)
            if len(parts) > 1:
                queue[:0] = parts
                continue
        if chunk.budget < 1:  # not even one word of text fits beside the rest of the prompt
            raise PromptTooLong(chunk.prompt_rows, limits.n_ctx)
        chunks.append(chunk)
    if voice == "chunk 1" and len(chunks) == 1:
        voice = "none"
    return SpeechPlan(whole, chunks, voice)


def _carried_frames(first: ChunkPlan) -> int:
    """The most frames of chunk 1 that the others carry (its budget bounds them from above)."""
    return max(1, min(VOICE_FRAMES, first.budget))


def _measure(tokenizer, info: ModelInfo, piece: Piece, index: int, limits: PlanLimits,
             fields: PromptFields, voice_frames: int) -> ChunkPlan:  # fmt: skip
    own = PromptFields(**{**fields.__dict__, "text": piece.text})
    codes = np.zeros((voice_frames, info.n_vq), dtype=np.int64) if voice_frames else None
    prompt = build_prompt(tokenizer, info, own, codes)
    rows = int(prompt.rows.shape[0])
    wanted = step_budget(piece.frames, limits.settings, info.n_vq)
    budget = min(wanted, limits.max_new_tokens, limits.n_ctx - rows)
    text, language = prompt_field(prompt.text, "Text"), prompt_field(prompt.text, "Language")
    return ChunkPlan(index, text if text is not None else piece.text, piece.gap,
                     None if language in (None, "None") else language, piece.frames,
                     budget, budget < wanted, rows)  # fmt: skip


def prompt_field(prompt_text: str, name: str) -> str | None:
    """A field of the user block as the prompt holds it (what the model reads)."""
    m = re.search(rf"- {re.escape(name)}:\n(.*?)\n(?:- [A-Z][\w ]*:\n|</user_inst>)",
                  prompt_text, re.DOTALL)  # fmt: skip
    return m.group(1) if m else None


@dataclass
class _Chunk:
    plan: ChunkPlan
    report: ChunkReport
    rows: list[np.ndarray] = field(default_factory=list)
    chunker: Any = None  # streaming: the chunk's Chunker
    pieces: list[np.ndarray] = field(default_factory=list)  # streamed audio not yet sent
    sent: bool = False  # some of its audio went out (a stream): no retry any more
    done: bool = False
    segments: list[np.ndarray] = field(default_factory=list)
    profile: SynthProfile | None = None


class Speech:
    """One request's chunks driven through the engine (see the module's docstring).

    TTS is the Synthesizer (prepare, chunker, chunk_segments, decode_raw); OPTIONS its
    `prepare` keywords (seed, sampling, reference_codes, instruction, ...). With ON_AUDIO the
    audio is streamed: ON_AUDIO(samples, chunk_index) in order. RETRIES: how often a runaway
    chunk is run again (0: never, e.g. a benchmark whose model never ends)."""

    def __init__(self, tts: Any, plan: SpeechPlan, options: dict[str, Any],
                 progress: ProgressReporter,
                 on_audio: Callable[[np.ndarray, int], None] | None = None,
                 retries: int = RETRIES, window: Any = None,
                 share_first: bool = False):  # fmt: skip
        self.tts, self.plan, self.options = tts, plan, dict(options)
        self.share_first = share_first  # chunk 1 too may restore a beginning (a server)
        self.window = window  # streaming: the StreamSettings of every chunk's Chunker
        self.progress, self.on_audio, self.retries = progress, on_audio, retries
        self.voice: np.ndarray | None = self.options.pop("reference_codes", None)
        self.seed: int | None = self.options.pop("seed", None)
        self.t_start = time.perf_counter()
        self.chunks = [_Chunk(c, ChunkReport(c.index, len(c.text), c.budget)) for c in plan.chunks]
        # a voice to carry from chunk 1 unless one is given; MOSS-TTSD's speakers are the
        # voices (each chunk holds their clips), and a sound effect has no voice to keep
        variant = getattr(getattr(tts, "info", None), "variant", "")
        self.carry = (self.voice is None and not self.options.get("speakers")
                      and variant not in ("MOSS-TTSD", "MOSS-SoundEffect"))  # fmt: skip
        self.pending: list[int] = [0] if self.carry else list(range(len(self.chunks)))
        self.running: dict[int, tuple[Utterance, int]] = {}  # id(u) → (u, chunk index)
        self.error: BaseException | None = None
        self.runaways: list[int] = []  # 1-based chunk numbers that ran away (after retries)
        self._head = 0  # the chunk whose audio goes out now (streaming)
        self._gain: np.float32 | None = None
        self._sent: list[np.ndarray] = []
        self._joiner = Joiner(self._out)

    def _out(self, audio: np.ndarray, index: int) -> None:
        self._sent.append(audio)
        assert self.on_audio is not None
        self.on_audio(audio, index)

    @property
    def done(self) -> bool:
        return self.error is not None or all(c.done for c in self.chunks)

    def ready(self, free: int) -> list[Utterance]:
        """Utterances to join now (at most FREE): chunks whose voice exists, in order."""
        out = []
        while self.pending and len(out) < free and self.error is None:
            out.append(self._utterance(self.pending.pop(0)))
        return out

    def ended(self, u: Utterance) -> None:
        """U (one of ours) left the engine: keep its audio, retry a runaway, go on."""
        _, index = self.running.pop(id(u))
        chunk = self.chunks[index]
        if u.error is not None:
            self.error = self.error or u.error
            return
        report, plan = chunk.report, chunk.plan
        report.steps, report.tries = u.count, report.tries + 1
        runaway = u.runaway
        if runaway and not plan.capped and report.tries <= self.retries and not chunk.sent:
            chunk.rows, chunk.chunker, chunk.pieces = [], None, []
            self.pending.insert(0, index)
            return
        report.ended = "end" if u.run.profile.stopped else ("cut" if plan.capped else "runaway")
        if report.ended == "runaway":
            self.runaways.append(index + 1)
        chunk.profile = u.run.profile
        self._finish(chunk)

    def abort(self, engine: Any, error: BaseException) -> None:
        """Take every running chunk out of ENGINE (the request failed or was cancelled)."""
        self.error = self.error or error
        for u, _ in list(self.running.values()):
            engine.leave(u, error)
        self.running.clear()

    # -- inside

    def _utterance(self, index: int) -> Utterance:
        chunk = self.chunks[index]
        tries = chunk.report.tries
        seed = None if self.seed is None else (self.seed + index + _SEED_STRIDE * tries) % 2**63
        run: Run = self.tts.prepare(chunk.plan.text, normalize=False, seed=seed,
                                    max_new_tokens=chunk.plan.budget,
                                    reference_codes=self.voice, **self.options)  # fmt: skip
        chunk.report.prompt = run.prompt
        if self.on_audio is not None:
            chunk.chunker = self.tts.chunker(self.window, run.prompt.continuation_codes)
            chunk.chunker.gain = np.float32(1.0)  # raw audio: the one gain is applied at sending

        def on_row(row: np.ndarray) -> None:
            chunk.rows.append(row)
            if chunk.chunker is not None:
                chunk.pieces.extend(chunk.chunker.push(row))
                if index == self._head:
                    self._send()

        u = Utterance(run, self.progress, on_row)
        # chunks 2..n begin alike (their voice; only the text differs): prefilled once. Not
        # chunk 1, whose prompt stays fed whole as upstream feeds it, unless SHARE_FIRST: a
        # server's requests with the same voice and fields begin alike too
        u.shares_prefix = index > 0 or self.share_first
        self.running[id(u)] = (u, index)
        return u

    def _finish(self, chunk: _Chunk) -> None:
        if chunk.chunker is not None:
            chunk.pieces.extend(chunk.chunker.finish())
            chunk.segments = chunk.chunker.decoder.segments
        else:
            chunk.segments = self.tts.chunk_segments(chunk.rows)
        chunk.report.frames = int(sum(s.shape[0] for s in chunk.segments))
        if chunk.segments:
            chunk.report.codes = np.concatenate(chunk.segments)
        chunk.done = True
        if chunk.plan.index == 0 and self.carry and len(self.chunks) > 1:
            if chunk.report.codes is not None:  # the voice of the rest: chunk 1's start
                self.voice = chunk.report.codes[:VOICE_FRAMES]
            self.pending.extend(range(1, len(self.chunks)))
        if self.on_audio is not None:
            self._send()

    def _send(self) -> None:
        """Stream what is due: the head chunk's pieces, then each finished chunk in turn."""
        while self._head < len(self.chunks):
            chunk = self.chunks[self._head]
            for piece in chunk.pieces:
                if self._gain is None:  # the first window's, held (as Chunker holds it)
                    self._gain = loudness_gain(piece)
                last = self._head == len(self.chunks) - 1
                self._joiner.push((piece * self._gain).astype(np.float32), hold=not last)
                chunk.sent = True
            chunk.pieces = []
            if not chunk.done:
                return
            self._joiner.end_chunk(join=self._head < len(self.chunks) - 1)
            self._head += 1

    # -- the result

    def result_audio(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """The whole waveform (joined, loudness-normalised unless streamed: a stream holds
        its first window's gain) and every chunk's segments, in order."""
        segments = [s for c in self.chunks for s in c.segments]
        if self.on_audio is not None:
            return np.concatenate(self._sent) if self._sent else np.empty(0, np.float32), segments
        pieces: list[np.ndarray] = []
        joiner = Joiner(lambda audio, _i: pieces.append(audio))
        for i, chunk in enumerate(self.chunks):
            if chunk.segments:
                prompt = chunk.report.prompt
                context = None if prompt is None else prompt.continuation_codes
                joiner.push(self.tts.decode_raw(chunk.segments, context))  # a whole chunk
            joiner.end_chunk(join=i < len(self.chunks) - 1 and bool(chunk.segments))
        whole = np.concatenate(pieces) if pieces else np.empty(0, np.float32)
        return loudness_normalize(whole), segments

    def profile(self) -> SynthProfile:
        """The chunks' profiles summed; wall time from the start."""
        out = SynthProfile(heads_backend=getattr(self.tts.heads, "backend", ""))
        done = [c.profile for c in self.chunks if c.profile is not None]
        for name in ("prompt_rows", "prefix_rows", "reference_frames", "steps", "reference_s",
                     "prefill_s", "embed_s", "backbone_s", "heads_s", "sampling_s", "decode_s"):
            setattr(out, name, sum(getattr(p, name) for p in done))
        out.stopped = bool(done) and all(p.stopped for p in done)
        out.frames = sum(c.report.frames for c in self.chunks)
        out.segments = sum(len(c.segments) for c in self.chunks)
        out.chunks, out.runaways = len(self.chunks), len(self.runaways)
        out.total_s = time.perf_counter() - self.t_start
        return out


class Joiner:
    """Chunks' audio in order → one stream: each join a FADE_SAMPLES fade out, PAUSE_FRAMES
    of silence, a fade in. The last FADE_SAMPLES of what came in are held back (unless it
    is the last chunk) until it is known whether a join follows them. OUT(samples,
    chunk_index) takes the result."""

    def __init__(self, out: Callable[[np.ndarray, int], None]):
        self.out = out
        self.chunk = 0
        self._tail = np.empty(0, dtype=np.float32)
        self._into = 0  # samples of this chunk already through (its fade in)

    def push(self, audio: np.ndarray, hold: bool = True) -> None:
        """AUDIO of the current chunk; HOLD false: no join follows it (the last chunk), so
        nothing is held back."""
        audio = np.asarray(audio, dtype=np.float32)
        if self.chunk > 0 and self._into < FADE_SAMPLES:
            n = min(audio.size, FADE_SAMPLES - self._into)
            audio = audio.copy()
            audio[:n] *= _ramp()[self._into : self._into + n]
        self._into += audio.size
        audio = np.concatenate([self._tail, audio])
        keep = max(0, audio.size - FADE_SAMPLES) if hold else audio.size
        self._tail = audio[keep:]
        if keep:
            self.out(audio[:keep], self.chunk)

    def end_chunk(self, join: bool) -> None:
        tail, self._tail = self._tail, np.empty(0, dtype=np.float32)
        if join:
            tail = tail * _ramp()[::-1][FADE_SAMPLES - tail.size :]
            tail = np.concatenate([tail, np.zeros(PAUSE_FRAMES * FRAME_SAMPLES, np.float32)])
        if tail.size:
            self.out(tail.astype(np.float32), self.chunk)
        self.chunk += 1
        self._into = 0


def _ramp() -> np.ndarray:
    """0 → 1 over FADE_SAMPLES, raised cosine."""
    t = (np.arange(FADE_SAMPLES, dtype=np.float64) + 0.5) / FADE_SAMPLES
    return (0.5 - 0.5 * np.cos(np.pi * t)).astype(np.float32)
