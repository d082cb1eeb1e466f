"""Streaming: the audio of an utterance decoded in windows while it is still being generated.

Generation gives one delayed row per step; `FrameAssembler` undoes the delay pattern a row at
a time (frame t is whole once row t + n_vq − 1 exists) and tells frames from segment breaks as
the whole-utterance path does (an all-pad frame ends a segment, a frame still holding a pad
code is dropped). `WindowDecoder` decodes each window with the left context (and lookahead)
the audio decoder needs, so a window's samples are those the whole segment's decode gives:

    decode(codes[start − left : stop + right])[start .. stop)  ==  decode(codes)[start .. stop)

How far the decoder looks is measured on the loaded graph, not assumed (`probe_receptive_field`):
change one frame's codes and see which output frames move. A decoder whose reach passes the
probe (e.g. a causal transformer attending to everything before) is given the whole segment
so far as context: still exact, at the cost of decoding the prefix again per window. A
decoder that needs future frames (right > 0) is held back that many frames.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from .codec import FRAME_SAMPLES, AudioCodec, loudness_gain


@dataclass(frozen=True)
class StreamSettings:
    """Window sizes in frames (1920 samples, 80 ms): a small first window for a quick first
    chunk, larger ones after it (fewer decoder calls, fewer network writes)."""

    first_window: int = 1
    window: int = 4


@dataclass(frozen=True)
class ReceptiveField:
    """How many frames of codes one output frame of the decoder depends on."""

    left: int | None  # past frames; None: more than the probe could see
    right: int  # future frames (0: causal)


def probe_receptive_field(codec: AudioCodec, codebook: int, frames: int = 24) -> ReceptiveField:
    """Measured: decode random codes twice, the middle frame changed the second time; the
    output frames that moved give the reach both ways. Deterministic (fixed seed)."""
    rng = np.random.default_rng(1920)
    codes = rng.integers(0, codebook, size=(frames, codec.n_vq), dtype=np.int64)
    middle = frames // 2
    changed = codes.copy()
    changed[middle] = (codes[middle] + codebook // 2) % codebook
    a = codec.decode(codes).reshape(frames, FRAME_SAMPLES)
    b = codec.decode(changed).reshape(frames, FRAME_SAMPLES)
    moved = np.flatnonzero(np.any(a != b, axis=1))
    if moved.size == 0:  # the frame did not matter at all: only itself, by definition
        return ReceptiveField(left=0, right=0)
    last, first = int(moved[-1]), int(moved[0])
    left = None if last == frames - 1 else last - middle
    return ReceptiveField(left=left, right=max(0, middle - first))


class FrameAssembler:
    """Delayed rows (n_vq audio codes each) in, one at a time; frames out as they complete."""

    FRAME, BREAK = "frame", "break"

    def __init__(self, n_vq: int, pad_code: int):
        self.n_vq, self.pad = n_vq, pad_code
        self._rows: deque[np.ndarray] = deque(maxlen=n_vq)

    def push(self, audio_row: np.ndarray) -> tuple[str, np.ndarray | None] | None:
        """(FRAME, codes (n_vq,)), (BREAK, None) or None (no frame yet, or one dropped)."""
        self._rows.append(np.asarray(audio_row, dtype=np.int64).copy())
        if len(self._rows) < self.n_vq:
            return None
        # codebook k of the oldest frame sits k rows after its first row
        frame = np.array([self._rows[k][k] for k in range(self.n_vq)], dtype=np.int64)
        is_pad = frame == self.pad
        if is_pad.all():
            return (self.BREAK, None)
        return None if is_pad.any() else (self.FRAME, frame)


class WindowDecoder:
    """One segment's frames in; its audio out in windows equal to the whole decode's."""

    def __init__(self, codec: AudioCodec, reach: ReceptiveField, settings: StreamSettings,
                 context: np.ndarray | None = None):  # fmt: skip
        self.codec, self.reach, self.settings = codec, reach, settings
        # the audio the first segment continues (a TTSD dialogue's joined clips): decoded
        # before its windows and cut off, as the whole decode does (Synthesizer.decode_raw)
        self.context = None if context is None or not len(context) else np.asarray(context)
        self.segments: list[np.ndarray] = []  # the frames of every finished segment
        self.decode_s = 0.0
        self._codes: list[np.ndarray] = []
        self._emitted = 0  # frames of the current segment already decoded and given out
        self._chunks = 0  # windows given out over the whole stream

    @property
    def frames(self) -> int:
        return sum(s.shape[0] for s in self.segments) + len(self._codes)

    def push(self, frame: np.ndarray) -> np.ndarray | None:
        """Audio for the next window once its frames (and the lookahead) are here."""
        self._codes.append(frame)
        want = self.settings.first_window if self._chunks == 0 else self.settings.window
        if len(self._codes) - self._emitted >= want + self.reach.right:
            return self._decode(len(self._codes) - self.reach.right)
        return None

    def end_segment(self) -> np.ndarray | None:
        """The segment's remaining audio; the next frame starts a new segment (no context)."""
        audio = self._decode(len(self._codes)) if len(self._codes) > self._emitted else None
        if self._codes:
            self.segments.append(np.stack(self._codes))
        self._codes, self._emitted = [], 0
        return audio

    def _decode(self, stop: int) -> np.ndarray:
        frames = np.stack(self._codes)
        before = 0  # context frames in front of the segment's (its first segment only)
        if self.context is not None and not self.segments:
            before = self.context.shape[0]
            frames = np.concatenate([self.context, frames])
        left = self.reach.left
        start = 0 if left is None else max(0, before + self._emitted - left)
        end = min(frames.shape[0], before + stop + self.reach.right)
        t0 = time.perf_counter()
        audio = self.codec.decode(frames[start:end])
        self.decode_s += time.perf_counter() - t0
        cut = before - start
        out = audio[(cut + self._emitted) * FRAME_SAMPLES : (cut + stop) * FRAME_SAMPLES]
        self._emitted = stop
        self._chunks += 1
        return out


class Chunker:
    """Generated rows (1 + n_vq ids) in, one at a time; the utterance's audio out in chunks,
    each scaled by the loudness gain of the first (the whole utterance is not known yet)."""

    def __init__(self, decoder: WindowDecoder, assembler: FrameAssembler):
        self.decoder, self.assembler = decoder, assembler
        self.gain: np.float32 | None = None
        self.pieces: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []

    def push(self, row: np.ndarray) -> list[np.ndarray]:
        self.rows.append(row)
        event = self.assembler.push(row[1:])
        if event is None:
            return []
        kind, frame = event
        if kind == FrameAssembler.FRAME:
            return self._out(self.decoder.push(frame))
        return self._out(self.decoder.end_segment())

    def finish(self) -> list[np.ndarray]:
        """The last window (the final segment's rest)."""
        return self._out(self.decoder.end_segment())

    def _out(self, audio: np.ndarray | None) -> list[np.ndarray]:
        if audio is None or not audio.size:
            return []
        if self.gain is None:
            self.gain = loudness_gain(audio)
        chunk = (audio * self.gain).astype(np.float32)
        self.pieces.append(chunk)
        return [chunk]


# ---------------------------------------------------------------- bytes of a stream

UNKNOWN_SIZE = 0xFFFFFFFF  # what a WAV header says while the length is not known yet


def pcm16(chunk: np.ndarray) -> bytes:
    """Float samples (−1..1) as 16-bit little-endian PCM, rounded as the whole-file path does."""
    clipped = np.clip(np.asarray(chunk, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return np.round(clipped * 32767.0).astype("<i2").tobytes()


def wav_header(rate: int, data_bytes: int | None = None, channels: int = 1) -> bytes:
    """The 44-byte header of a 16-bit WAV (mono unless CHANNELS). Without DATA_BYTES the
    sizes say 'unknown' (0xFFFFFFFF), as streamed WAVs do: players read until the stream
    ends. soundfile needs a seekable file to write one, so it is packed here."""
    data = UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", riff, b"WAVE", b"fmt ", 16, 1, channels,
                       rate, rate * 2 * channels, 2 * channels, 16, b"data", data)  # fmt: skip
