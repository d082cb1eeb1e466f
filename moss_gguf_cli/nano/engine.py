"""MOSS-TTS-Nano speaking: a Nano folder loaded, text in, 48 kHz stereo out (docs/nano.md).

The global transformer runs as ggml graphs of our own on the folder's starcoder2 GGUF
(nano/ggml_global.py, fed embeddings; the file is the one llama.cpp loads), the local
transformer, heads and sampling (tts/sampling.pick_one's rule at upstream's Nano defaults) as
one ggml graph a frame (nano/ggml_local.py; NumPy's reference in nano/local.py), the codec
through decode_step
(nano/codec.py). A text is split into chunks (nano/prompt.split_text), each spoken from its
own prompt with the same reference codes, joined with upstream's pauses. `NanoEngine.speak`
yields the audio as it is decoded; collecting it gives the whole answer, the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..disk.confine import boundary, child, confined
from ..disk.layout_names import FAMILY_KEY
from ..errors import InputError, ToolError, UsageError
from ..native.cpu_features import physical_cores
from ..native.libggml import GgmlUnavailable
from ..tts.sampling import Sampler, SamplingParams
from .codec import DecodePlan, NanoCodecRuntime
from .codec_folder import open_nano_codec
from .config import FAMILY_NAME, NanoConfig
from .ggml_global import GgmlGlobal
from .ggml_local import GgmlLocal, aligned
from .layout import local_files, table_files
from .local import DEFAULT_LOCAL_TYPE, LOCAL_TYPES, NumpyLocal, load_arrays
from .prompt import NanoTokenizer, pause_after, prompt_ids, prompt_rows, split_text
from .settings import SETTING_KEYS, NanoSettings

_HINT = "rerun `moss-gguf all` on the model"
SHARED_KEPT = 8  # voices whose shared prompt rows are kept as KV state (~5-10 MB each)
RETRY_SEED_STRIDE = 1_000_003  # a runaway chunk's retry reseeds: far from the request's seed


@dataclass(frozen=True)
class NanoFolderConfig:
    """A Nano folder's moss-tts-nano.yaml: its files, resolved inside the folder, and the
    sampling defaults it sets."""

    folder: Path
    global_gguf: Path
    tokenizer: Path
    codec: Path | None
    nano: NanoConfig
    settings: NanoSettings
    n_ctx: int = 2048
    n_threads: int = 0  # 0: the physical cores
    local_type: str = DEFAULT_LOCAL_TYPE  # the local transformer's form (nano/ggml_local.py)
    source: Path | None = None  # the YAML it was read from (an error says what to change there)

    @classmethod
    def from_yaml(cls, path: Path) -> NanoFolderConfig:
        path = Path(path).expanduser()
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise InputError(f"cannot read the config YAML: {str(exc).splitlines()[0]}",
                             path=path) from None  # fmt: skip
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> NanoFolderConfig:
        if not isinstance(data, dict) or data.get(FAMILY_KEY) != FAMILY_NAME:
            raise InputError(f"not a MOSS-TTS-Nano config ({FAMILY_KEY}: {FAMILY_NAME})",
                             path=path, hint=_HINT)  # fmt: skip
        folder = path.resolve().parent
        root = boundary(folder)

        def inside(key: str) -> Path:
            if not isinstance(data.get(key), str):
                raise InputError(f"the config names no {key}", path=path, hint=_HINT)
            return confined(child(folder, data[key], key, path), root)

        config_json = folder / "config.json"
        try:
            nano = NanoConfig.from_dict(json.loads(config_json.read_text(encoding="utf-8")),
                                        config_json)  # fmt: skip
        except (OSError, ValueError, RecursionError) as exc:
            raise InputError(f"cannot read the model's config ({exc})", path=config_json,
                             hint=_HINT) from None  # fmt: skip
        settings = NanoSettings()
        values = {k: data[k] for k in SETTING_KEYS if data.get(k) is not None}
        try:
            settings = settings.override(**{k: type(getattr(settings, k))(v)
                                            for k, v in values.items()})  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise InputError(f"a sampling value has the wrong type ({exc})", path=path) from None
        try:
            settings.check()
        except UsageError as exc:  # refused when the folder loads, not at each request
            raise InputError(str(exc), path=path) from None
        codec = inside("audio_tokenizer_dir") if data.get("audio_tokenizer_dir") else None
        local_type = str(data.get("local_type") or DEFAULT_LOCAL_TYPE)
        if local_type not in LOCAL_TYPES:
            raise InputError(f"local_type {local_type!r} is not one of {', '.join(LOCAL_TYPES)}",
                             path=path)  # fmt: skip
        try:
            n_ctx, n_threads = int(data.get("n_ctx") or 2048), int(data.get("n_threads") or 0)
        except (TypeError, ValueError):
            raise InputError("n_ctx and n_threads must be whole numbers", path=path) from None
        return cls(folder, inside("global_gguf"), inside("tokenizer"), codec, nano, settings,
                   n_ctx, n_threads, local_type, path)  # fmt: skip


def engines_for(at_once: int, n_threads: int = 0) -> tuple[int, int]:
    """(engines, threads each) to speak AT_ONCE requests at a time: at most one engine a
    physical core (so that each request keeps at least a core's pace), each on every core
    unless N_THREADS says: the engines take turns a frame at a time on one thread
    (nano/serving.py), so one computes at a time."""
    cores = physical_cores()
    return max(1, min(at_once, cores)), n_threads or cores


def positions(prompt_rows: int, max_new_tokens: int) -> int:
    """The global transformer's positions a chunk of MAX_NEW_TOKENS frames may take: its
    prompt, then a row fed back after every frame but the last (`NanoEngine.frames`)."""
    return prompt_rows + max_new_tokens - 1


class ContextTooShort(InputError):
    """A chunk whose prompt and max_new_tokens frames need more positions than n_ctx: refused
    before the first frame of the request, where the global transformer would refuse it only
    at the frame that passes n_ctx, with the audio made before it lost. CHUNK is 1-based."""

    def __init__(self, chunk: int, chunks: int, prompt: int, reference_frames: int,
                 settings: NanoSettings, n_ctx: int):  # fmt: skip
        self.chunk, self.chunks, self.prompt, self.n_ctx = chunk, chunks, prompt, n_ctx
        self.reference_frames = reference_frames
        self.max_new_tokens, self.min_new_tokens = settings.max_new_tokens, settings.min_new_tokens
        self.needed = positions(prompt, self.max_new_tokens)
        where = "the text" if chunks == 1 else f"the text's chunk {chunk} of {chunks}"
        super().__init__(f"{where} needs {self.needed:,} positions (prompt {prompt:,} + "
                         f"max_new_tokens {self.max_new_tokens:,} - 1) but n_ctx is {n_ctx:,}",
                         hint=self.advice())  # fmt: skip

    @property
    def room(self) -> int:
        """The most max_new_tokens this chunk's prompt leaves room for (below 1: none)."""
        return self.n_ctx - self.prompt + 1

    def advice(self, max_name: str = "max_new_tokens", min_name: str = "min_new_tokens",
               more_ctx: str | None = "raise n_ctx in the config",
               shorter: str = "use a shorter reference clip") -> str:  # fmt: skip
        """What to change, in the caller's names for the settings (the command's options, the
        request's fields); MORE_CTX None: n_ctx is not the caller's to change."""
        fixes = []
        if self.room >= 1:
            names = max_name if self.min_new_tokens <= self.room else f"{max_name} and {min_name}"
            fixes.append(f"lower {names} to {self.room:,} or less")
        elif self.reference_frames:
            fixes.append(shorter)
        if more_ctx:
            fixes.append(more_ctx)
        return ", or ".join(fixes)


@dataclass(frozen=True)
class NanoRequest:
    """A request checked to fit the context: its chunks, reference codes and settings."""

    chunks: list[str]
    reference: np.ndarray | None
    settings: NanoSettings


@dataclass
class ChunkResult:
    index: int
    text: str
    frames: int = 0
    ended: str = ""  # "stop": the model ended it; "max": max_new_tokens reached
    codes: list[np.ndarray] = field(default_factory=list)  # its frames, (n_vq,) each
    retried: int = 0  # times it ran away and was run again (NanoSpeech's retries)


@dataclass
class NanoProfile:
    prompt_rows: int = 0
    prefill_s: float = 0.0
    global_s: float = 0.0
    local_s: float = 0.0
    decode_s: float = 0.0
    frames: int = 0
    samples: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def total_s(self) -> float:
        return time.perf_counter() - self.started


class NanoEngine:
    """A loaded Nano folder. One utterance at a time (`lock`): the global transformer holds
    one KV sequence."""

    def __init__(self, config: NanoFolderConfig, n_threads: int | None = None,
                 n_ctx: int | None = None):  # fmt: skip
        if config.codec is None:
            raise InputError("this Nano folder has no audio tokenizer, so it cannot speak",
                             path=config.folder,
                             hint="rerun `moss-gguf all` with --audio-tokenizer")  # fmt: skip
        self.config, nano = config, config.nano
        self.nano, self.tokens = nano, nano.tokens
        self.lock = threading.Lock()
        threads = n_threads if n_threads is not None else config.n_threads
        folder = config.folder
        tables = load_arrays(folder, list(table_files(nano)))
        names = list(table_files(nano))
        self.wte = tables[names[0]]
        # aligned so that the ggml frame reads the tables where they are (no second copy)
        self.audio = [aligned(tables[n]) for n in names[1:]]
        local = load_arrays(folder, list(local_files(nano)))
        local = {Path(k).name[: -len(".npy")]: v for k, v in local.items()}
        slot, end = self.tokens["audio_assistant_slot_token_id"], self.tokens["audio_end_token_id"]
        # position 0's head: continue vs stop (wte's rows); position k + 1's: audio table k
        heads = [np.ascontiguousarray(self.wte[[slot, end]]), *self.audio]
        start = self.wte[slot]  # position 1's input
        if config.local_type == "numpy":
            self.local: GgmlLocal | NumpyLocal = NumpyLocal(local, nano.dims, nano.local_layers,
                                                            heads, start)  # fmt: skip
        else:
            # as many threads as the global transformer (docs/nano.md, "Speed")
            try:
                self.local = GgmlLocal(local, nano.dims, nano.local_layers, heads, start,
                                       config.local_type, threads or physical_cores())  # fmt: skip
            except GgmlUnavailable as exc:
                raise ToolError(f"the local transformer cannot be built in ggml: {exc}",
                                hint="set local_type: numpy in the YAML (slower), or "
                                "reinstall llama-cpp-python") from None  # fmt: skip
        try:
            self.global_transformer = GgmlGlobal(config.global_gguf, n_ctx or config.n_ctx,
                                                 threads or physical_cores())  # fmt: skip
        except GgmlUnavailable as exc:
            self.local.close()
            raise ToolError(f"the global transformer cannot be built in ggml: {exc}",
                            hint="reinstall llama-cpp-python") from None  # fmt: skip
        except BaseException:  # a GGUF refused: the local graphs' memory goes with it
            self.local.close()
            raise
        self.tokenizer = NanoTokenizer(config.tokenizer)
        self.codec = NanoCodecRuntime(open_nano_codec(config.codec), threads=1)
        self.sample_rate, self.channels = self.codec.sample_rate, self.codec.channels
        self.frame_samples = self.sample_rate * 2 // 25  # 12.5 frames a second
        self._row = np.empty(nano.hidden, np.float32)
        self._shared: dict[bytes, Any] = {}  # a voice's shared prompt rows' KV state
        self.plan = DecodePlan()

    def close(self) -> None:
        self.global_transformer.close()
        self.local.close()

    # -- prompts

    def reference_codes(self, clip: Path) -> np.ndarray:
        """(frames, n_vq) codes of a reference clip (any rate and channels)."""
        codes = self.codec.encode(self.codec.read_clip(clip))
        if codes.shape[0] == 0:
            raise InputError("the reference clip is too short to hold one frame", path=clip)
        return codes

    def prompt(self, text: str, reference: np.ndarray | None) -> np.ndarray:
        """TEXT's prompt rows (S, n_vq + 1), with REFERENCE codes or without."""
        return self.prompt_parts(text, reference)[0]

    def prompt_parts(self, text: str, reference: np.ndarray | None) -> tuple[np.ndarray, int]:
        """TEXT's prompt rows and how many of them every prompt of this voice shares."""
        ids = prompt_ids(self.tokenizer, self.tokens, text, reference is not None)
        rows = prompt_rows(ids, reference, self.tokens, self.nano.n_vq, self.nano.audio_pad)
        frames = 0 if reference is None else reference.shape[0]
        return rows, ids.shared_rows(frames)

    def _prefill(self, rows: np.ndarray, shared: int) -> np.ndarray:
        """The prompt fed: its SHARED rows from the kept state of an earlier prompt of the same
        voice (or filled and kept now), then the rest. Fed in those two parts always, so an
        answer's bits do not depend on what was asked before."""
        embeds = self.embed(rows).astype(np.float32)
        key = hashlib.sha256(rows[:shared].tobytes()).digest()
        state = self._shared.pop(key, None)
        transformer = self.global_transformer
        transformer.reset()
        if state is None:
            transformer.fill(embeds[:shared])
            state = transformer.save()
        else:
            transformer.load(state)
        self._shared[key] = state  # the most recent last
        while len(self._shared) > SHARED_KEPT:
            self._shared.pop(next(iter(self._shared)))
        return transformer.prefill(embeds[shared:])

    def embed(self, rows: np.ndarray) -> np.ndarray:
        """(S, hidden) inputs: wte[text id] + Σ_q audio_embeddings_q[code] where not padded."""
        out = self.wte[rows[:, 0]].copy()
        for q, table in enumerate(self.audio):
            codes = rows[:, q + 1]
            real = codes != self.nano.audio_pad
            if real.any():
                out[real] += table[codes[real]]
        return out

    # -- frames

    def frames(self, rows: np.ndarray, shared: int, settings: NanoSettings, sampler: Sampler,
               chunk: ChunkResult, profile: NanoProfile) -> Iterator[np.ndarray]:  # fmt: skip
        """The frames (n_vq,) of one prompt, until the model stops or max_new_tokens."""
        slot = self.tokens["audio_assistant_slot_token_id"]
        local = self.local
        t = time.perf_counter()
        hidden = self._prefill(rows, shared)
        profile.prefill_s += time.perf_counter() - t
        profile.prompt_rows += rows.shape[0]
        local.forget()
        for f in range(settings.max_new_tokens):
            t = time.perf_counter()
            picks = local.frame(hidden, sampler, f >= settings.min_new_tokens)
            if picks[0] == 1:
                chunk.ended = "stop"
                profile.local_s += time.perf_counter() - t
                return
            codes = picks[1:].astype(np.int64)
            profile.local_s += time.perf_counter() - t
            chunk.frames += 1
            chunk.codes.append(codes)
            profile.frames += 1
            yield codes
            if f + 1 == settings.max_new_tokens:
                break
            t = time.perf_counter()
            row = self._row
            row[:] = self.wte[slot]
            for q, table in enumerate(self.audio):
                row += table[codes[q]]
            hidden = self.global_transformer.step(row)
            profile.global_s += time.perf_counter() - t
        chunk.ended = "max"

    # -- speech

    def speak(self, text: str, reference: np.ndarray | None = None,
              settings: NanoSettings | None = None) -> NanoSpeech:  # fmt: skip
        """TEXT spoken (with REFERENCE codes, or the model's own voice); iterate the result
        for the audio. The caller holds `lock` while iterating."""
        return self.speech(self.prepare(text, reference, settings))

    def prepare(self, text: str, reference: np.ndarray | None = None,
                settings: NanoSettings | None = None) -> NanoRequest:  # fmt: skip
        """TEXT's chunks, each checked to fit n_ctx with its prompt and max_new_tokens frames
        (ContextTooShort): the whole request is refused before its first frame, not at the
        frame that passes n_ctx. Costs the text's tokenizing, no model work; any engine of
        the same folder and n_ctx may speak the result."""
        settings = settings or self.config.settings
        settings.check()
        chunks = split_text(self.tokenizer, text)
        frames = 0 if reference is None else int(reference.shape[0])
        n_ctx = self.global_transformer.n_ctx
        for i, chunk in enumerate(chunks):
            ids = prompt_ids(self.tokenizer, self.tokens, chunk, reference is not None)
            rows = ids.rows(frames)
            if positions(rows, settings.max_new_tokens) > n_ctx:
                raise ContextTooShort(i + 1, len(chunks), rows, frames, settings, n_ctx)
        return NanoRequest(chunks, reference, settings)

    def speech(self, request: NanoRequest, retries: int = 0) -> NanoSpeech:
        """REQUEST's audio, to iterate (holding `lock`); RETRIES: NanoSpeech's."""
        return NanoSpeech(self, request.chunks, request.reference, request.settings, retries)


_blas_lock = threading.Lock()
_blas_users: list[Any] = []  # the limit in force while any speech runs, and who holds it


@contextlib.contextmanager
def _blas_one_thread() -> Iterator[None]:
    """NumPy's BLAS held to one thread while any speech runs (engines on several threads
    share the process's BLAS): the heads' matrix-vector products are too small to share,
    and idle BLAS threads spin against llama.cpp's (4x slower frames measured on 2 cores)."""
    from threadpoolctl import threadpool_limits

    with _blas_lock:
        if not _blas_users:
            _blas_users.append(threadpool_limits(limits=1, user_api="blas"))
        _blas_users.append(None)
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users.pop()
            if len(_blas_users) == 1:
                _blas_users.pop().restore_original_limits()


class NanoSpeech:
    """One request's audio as it is made: iterate for (channels, samples) float32 pieces;
    `chunks` and `profile` say what happened.

    RETRIES: how often a runaway chunk (max_new_tokens reached though min_new_tokens left its
    stop allowed) is run again, its generator reseeded. Its pieces are then held until the
    chunk stands (the same pieces, later), so none of a try that is run again comes out."""

    def __init__(self, engine: NanoEngine, texts: list[str], reference: np.ndarray | None,
                 settings: NanoSettings, retries: int = 0):  # fmt: skip
        self.engine, self.texts, self.reference, self.settings = engine, texts, reference, settings
        self.retries = retries
        self.chunks = [ChunkResult(i, t) for i, t in enumerate(texts)]
        self.profile = NanoProfile()
        self._params = (SamplingParams(settings.text_temperature, settings.text_top_p,
                                       settings.text_top_k),
                        SamplingParams(settings.audio_temperature, settings.audio_top_p,
                                       settings.audio_top_k, settings.audio_repetition_penalty))
        self.sampler = Sampler(*self._params, settings.seed)
        self.current = 0  # the chunk being spoken
        # called once a frame (a server's check that the request is still wanted: it raises)
        self.on_frame: Callable[[], None] | None = None

    @property
    def frames(self) -> int:
        return sum(c.frames for c in self.chunks)

    def __iter__(self) -> Iterator[np.ndarray]:
        for piece in self.steps():
            if piece is not None:
                yield piece

    def steps(self) -> Iterator[np.ndarray | None]:
        """The pieces `__iter__` gives, and None after each frame that completed none: a
        caller speaking several requests on one thread takes turns frame by frame."""
        with _blas_one_thread():
            yield from self._pieces()

    def _pieces(self) -> Iterator[np.ndarray | None]:
        engine, profile = self.engine, self.profile
        last = len(self.texts) - 1
        for chunk in self.chunks:
            self.current = chunk.index
            held: list[np.ndarray] = []
            while True:
                before = (profile.prompt_rows, profile.frames, profile.samples)
                for piece in self._chunk(chunk):
                    if self.retries and piece is not None:
                        held.append(piece)  # out once the chunk stands
                        piece = None
                    yield piece
                if not self._runs_again(chunk):
                    break
                held = []
                profile.prompt_rows, profile.frames, profile.samples = before
            yield from held
            if chunk.index < last and chunk.frames:
                pause = round(engine.sample_rate * pause_after(chunk.text))
                profile.samples += pause
                yield np.zeros((engine.channels, pause), np.float32)

    def _chunk(self, chunk: ChunkResult) -> Iterator[np.ndarray | None]:
        """One try of CHUNK: its pieces as they are decoded, None after a frame that made none."""
        engine, plan = self.engine, self.engine.plan
        rows, shared = engine.prompt_parts(chunk.text, self.reference)
        decoder, pending, calls = engine.codec.stream(), [], 0
        for codes in engine.frames(rows, shared, self.settings, self.sampler, chunk,
                                   self.profile):  # fmt: skip
            if self.on_frame is not None:
                self.on_frame()
            pending.append(codes)
            take = plan.ready(calls, len(pending))
            if take:
                yield self._decode(decoder, pending[:take])
                pending, calls = pending[take:], calls + 1
            else:
                yield None
        if pending:
            yield self._decode(decoder, pending)

    def _runs_again(self, chunk: ChunkResult) -> bool:
        """Whether CHUNK ran away and has a retry left: then it is cleared for its next try and
        the request's generator reseeded (another seed, still a function of the request's)."""
        settings = self.settings
        stop_allowed = settings.min_new_tokens < settings.max_new_tokens
        if chunk.ended != "max" or not stop_allowed or chunk.retried >= self.retries:
            return False
        chunk.retried += 1
        chunk.frames, chunk.ended, chunk.codes = 0, "", []
        seed = settings.seed
        if seed is not None:
            seed = (seed + chunk.index + RETRY_SEED_STRIDE * chunk.retried) % 2**63
        self.sampler = Sampler(*self._params, seed)
        return True

    def _decode(self, decoder, frames: list[np.ndarray]) -> np.ndarray:
        t = time.perf_counter()
        audio = decoder.decode(np.stack(frames))
        self.profile.decode_s += time.perf_counter() - t
        self.profile.samples += audio.shape[1]
        return audio
