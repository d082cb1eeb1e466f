"""How a model family's audio becomes a response's bytes, whole and streamed.

The delay models speak 24 kHz mono: every format carries it as it is. MOSS-TTS-Nano speaks
48 kHz stereo: wav, flac, mp3, opus and aac carry that, and `pcm` is OpenAI's pcm (24 kHz
mono 16-bit little-endian, what its clients play it as): the channels averaged, then
resampled (tts/codec.StreamResampler). A whole Nano `pcm` answer is made from the same pieces
a stream is, through the same resampler, so the two are the same bytes.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..tts.codec import StreamResampler
from ..tts.streaming import pcm16, wav_header
from . import audio

OPENAI_PCM_RATE = 24_000


class Streamer(Protocol):
    header: bytes

    def piece(self, samples: np.ndarray) -> bytes: ...

    def end(self) -> bytes: ...


class _Plain:
    """16-bit samples as they come (channels interleaved)."""

    def __init__(self, header: bytes):
        self.header = header

    def piece(self, samples: np.ndarray) -> bytes:
        return pcm16(samples.T if samples.ndim == 2 else samples)

    def end(self) -> bytes:
        return b""


class _OpenAIPcm:
    """(channels, samples) pieces → 24 kHz mono 16-bit: averaged, resampled as they come."""

    header = b""

    def __init__(self, rate: int):
        self._resampler = StreamResampler(rate, OPENAI_PCM_RATE)

    def piece(self, samples: np.ndarray) -> bytes:
        return pcm16(self._resampler.feed(samples.mean(axis=0, dtype=np.float32)))

    def end(self) -> bytes:
        return pcm16(self._resampler.end())


class MonoOut:
    """The delay family: mono at the model's rate in every format."""

    channels = 1

    def __init__(self, rate: int):
        self.rate = rate

    def whole(self, result: Any, fmt: str, speed: float) -> bytes:
        return audio.encode(audio.change_speed(result.waveform, self.rate, speed), self.rate, fmt)

    def streamer(self, fmt: str) -> Streamer:
        return _Plain(wav_header(self.rate) if fmt == "wav" else b"")

    def stream_rate(self, fmt: str) -> int:
        return self.rate


class StereoOut:
    """MOSS-TTS-Nano: (channels, samples) at the model's rate; pcm as OpenAI's."""

    def __init__(self, rate: int, channels: int):
        self.rate, self.channels = rate, channels

    def whole(self, result: Any, fmt: str, speed: float) -> bytes:
        if fmt == "pcm":
            pieces = result.pieces if speed == 1.0 else [
                audio.change_speed(result.waveform, self.rate, speed)]  # fmt: skip
            pcm = _OpenAIPcm(self.rate)
            return b"".join([*(pcm.piece(p) for p in pieces), pcm.end()])
        return audio.encode(audio.change_speed(result.waveform, self.rate, speed), self.rate, fmt)

    def streamer(self, fmt: str) -> Streamer:
        if fmt == "pcm":
            return _OpenAIPcm(self.rate)
        return _Plain(wav_header(self.rate, None, self.channels))

    def stream_rate(self, fmt: str) -> int:
        return OPENAI_PCM_RATE if fmt == "pcm" else self.rate
