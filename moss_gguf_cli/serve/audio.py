"""A waveform as the bytes of each response format, and the tempo change behind `speed`.

- wav, flac, pcm: the same 16-bit samples through soundfile (`pcm` as OpenAI's: little-endian
  mono at the model's rate, no header);
- mp3, opus (in Ogg), aac (in ADTS): PyAV's libmp3lame / libopus / aac encoders (ffmpeg).

`speed` changes the tempo, not the pitch: ffmpeg's `atempo` filter (a waveform-similarity
overlap-add) through PyAV. Resampling would change both, so it is not used for this.
"""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import numpy as np

from .api_errors import ApiError
from .settings import CLIP_RATES, MAX_CLIP_CHANNELS, MAX_CLIP_SECONDS

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# (container, codec, bit rate) of the compressed formats; speech needs little
_AV = {"mp3": ("mp3", "libmp3lame", 64_000), "opus": ("ogg", "libopus", 32_000),
       "aac": ("adts", "aac", 64_000)}  # fmt: skip
SPEED_RANGE = (0.25, 4.0)  # OpenAI's


def encode(waveform: np.ndarray, rate: int, fmt: str) -> bytes:
    """WAVEFORM (float32 mono, −1..1; or (channels, samples)) as the bytes of FMT (one of
    FORMATS)."""
    waveform = np.asarray(waveform, dtype=np.float32)
    if waveform.ndim == 2 and waveform.shape[0] > 1:
        return _encode_channels(np.clip(waveform, -1.0, 1.0), rate, fmt)
    samples = np.clip(waveform.reshape(-1), -1.0, 1.0)
    if fmt in ("wav", "flac", "pcm"):
        import soundfile as sf

        # rounded here, once: libsndfile's own float → 16-bit rounding differs by format, and
        # wav, flac and pcm must hold the same samples
        ints = np.round(samples * 32767.0).astype(np.int16)
        buffer = io.BytesIO()
        if fmt == "pcm":  # OpenAI's: 16-bit little-endian mono, no header
            sf.write(buffer, ints, rate, subtype="PCM_16", format="RAW", endian="LITTLE")
        else:
            sf.write(buffer, ints, rate, subtype="PCM_16", format=fmt.upper())
        return buffer.getvalue()
    if fmt in _AV:
        return _encode_av(samples, rate, *_AV[fmt])
    raise ValueError(f"unknown response format {fmt!r}")


def _encode_channels(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    """(channels, samples) audio as wav / flac (16-bit, interleaved) or mp3 / opus / aac."""
    if fmt in ("wav", "flac"):
        import soundfile as sf

        ints = np.round(audio * 32767.0).astype(np.int16)
        buffer = io.BytesIO()
        sf.write(buffer, np.ascontiguousarray(ints.T), rate, subtype="PCM_16", format=fmt.upper())
        return buffer.getvalue()
    if fmt in _AV:
        return _encode_av(audio, rate, *_AV[fmt])
    raise ValueError(f"{fmt!r} is not a format for {audio.shape[0]} channels")


def _layout(channels: int) -> str:
    return {1: "mono", 2: "stereo"}[channels]


def _frame(samples: np.ndarray, rate: int):
    """A PyAV frame of (samples,) mono or (channels, samples) planar float audio."""
    import av

    planar = samples.ndim == 2
    data = samples if planar else samples.reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data, dtype=np.float32),
                                       format="fltp" if planar else "flt",
                                       layout=_layout(data.shape[0]))  # fmt: skip
    frame.sample_rate = rate
    frame.pts = 0
    frame.time_base = Fraction(1, rate)
    return frame


def _encode_av(samples: np.ndarray, rate: int, container: str, codec: str, bit_rate: int) -> bytes:
    import av

    buffer = io.BytesIO()
    channels = samples.shape[0] if samples.ndim == 2 else 1
    with av.open(buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=_layout(channels))
        stream.bit_rate = bit_rate * channels
        frame = _frame(samples, rate)
        for packet in stream.encode(frame):  # PyAV re-frames to the codec's frame size
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def change_speed(waveform: np.ndarray, rate: int, speed: float) -> np.ndarray:
    """WAVEFORM (mono, or (channels, samples)) played SPEED times as fast at the same pitch
    (ffmpeg's atempo)."""
    if speed == 1.0:
        return waveform
    import av
    from av.filter import Graph

    planar = np.ndim(waveform) == 2
    channels = np.shape(waveform)[0] if planar else 1
    graph = Graph()
    source = graph.add_abuffer(format="fltp" if planar else "flt", sample_rate=rate,
                               layout=_layout(channels), time_base=Fraction(1, rate))  # fmt: skip
    chain = [source]
    for factor in _atempo_factors(speed):
        chain.append(graph.add("atempo", f"{factor:.6f}"))
    chain.append(graph.add("abuffersink"))
    for a, b in zip(chain, chain[1:], strict=False):
        a.link_to(b)
    graph.configure()

    frame = _frame(np.asarray(waveform, dtype=np.float32), rate)
    graph.push(frame)
    graph.push(None)
    pieces = []
    while True:
        try:
            out = graph.pull()
        except (av.error.EOFError, av.error.BlockingIOError):
            break
        pieces.append(_planar(out.to_ndarray(), out.format.is_planar, channels))
    if not pieces:
        return np.zeros((channels, 0) if planar else 0, np.float32)
    joined = np.concatenate(pieces, axis=1).astype(np.float32)
    return joined if planar else joined.reshape(-1)


def _planar(data: np.ndarray, is_planar: bool, channels: int) -> np.ndarray:
    """A pulled frame's samples as (channels, samples)."""
    return data if is_planar else data.reshape(-1, channels).T


def _atempo_factors(speed: float) -> list[float]:
    """One atempo works in 0.5..100; 0.25 is two halvings (ffmpeg's advice for lower)."""
    factors = []
    while speed < 0.5:
        factors.append(0.5)
        speed /= 0.5
    return [*factors, speed]


def probe_clip(path: Path, name: str | None = None) -> None:
    """Refuse a voice clip by its header, before it is decoded: one soundfile cannot read,
    a sample rate the resampler would need gigabytes for, more channels or seconds than a
    reference voice needs (a small compressed file can say hours). NAME: the client's name
    for the file, shown (cut short) in the messages; the server's path never is."""
    import soundfile as sf

    shown = f"file {name[:64]!r}" if name else "file"

    try:
        info = sf.info(str(path))
    except Exception:  # noqa: BLE001 - libsndfile's errors: not audio it reads
        raise ApiError(400, f"{shown} is not audio this server reads; send a WAV, FLAC or OGG "
                       "clip", param="file", code="invalid_audio") from None  # fmt: skip
    low, high = CLIP_RATES
    if not low <= info.samplerate <= high:
        raise ApiError(400, f"{shown} says its sample rate is {info.samplerate} Hz; a clip must "
                       f"be {low}-{high} Hz", param="file", code="invalid_audio")  # fmt: skip
    if not 1 <= info.channels <= MAX_CLIP_CHANNELS:
        raise ApiError(400, f"{shown} has {info.channels} channels; a clip has 1 to "
                       f"{MAX_CLIP_CHANNELS}", param="file", code="invalid_audio")  # fmt: skip
    if info.frames <= 0:
        raise ApiError(400, f"{shown} holds no audio", param="file", code="invalid_audio")
    if info.frames / info.samplerate > MAX_CLIP_SECONDS:
        raise ApiError(413, f"{shown} is {info.frames / info.samplerate:.0f} s of audio, the "
                       f"limit is {MAX_CLIP_SECONDS:.0f} s; a clip of 5-20 s is plenty",
                       param="file", code="clip_too_long")  # fmt: skip
