"""The Nano codec at run time: a reference clip encoded to codes, and frames decoded to 48 kHz
stereo through decode_step with its streaming state carried from call to call.

Every response is decoded through decode_step in the same groups of frames (`DecodePlan`), so
a streamed answer is the whole answer cut in pieces, byte for byte, and the state is started
afresh for each chunk of a long text (each chunk is its own utterance). ONNX Runtime's thread
spinning is off: its pools would spin against llama.cpp's threads on a small CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..tts.codec import resample
from .codec_folder import NanoCodec, initial_state, next_state

# decode_step is called on 1 frame, then 2, 4, then 8 at a time: the first sound comes after
# one frame, and later calls amortise the call's overhead over more audio
FIRST_GROUPS = (1, 2, 4)
GROUP = 8


@dataclass(frozen=True)
class DecodePlan:
    """Which frames each decode_step call takes: FIRST_GROUPS, then GROUP at a time."""

    first: tuple[int, ...] = FIRST_GROUPS
    group: int = GROUP

    def ready(self, calls: int, available: int) -> int:
        """Frames the next call takes when AVAILABLE frames are not decoded yet (0: wait)."""
        want = self.first[calls] if calls < len(self.first) else self.group
        return want if available >= want else 0


def _session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own Fail/InvalidGraph
        raise InputError(f"onnxruntime cannot load it ({str(exc).splitlines()[0]})", path=path,
                         hint="download the codec's ONNX release again") from None  # fmt: skip


def _run(session, feeds: dict) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


class NanoCodecRuntime:
    """The codec's encode and decode_step sessions (encode loaded when first needed)."""

    def __init__(self, codec: NanoCodec, threads: int = 1):
        self.codec, self.threads = codec, threads
        self.sample_rate, self.channels = codec.sample_rate, codec.channels
        self._decode = _session(codec.graphs["decode_step"], threads)
        self._encode = None

    def read_clip(self, path: Path) -> np.ndarray:
        """A clip as the codec takes it: (channels, T) float32 at its rate (mono repeated on
        each channel; more channels than the codec's mixed down first)."""
        import soundfile as sf

        path = Path(path)
        try:
            data, rate = sf.read(str(path), dtype="float32", always_2d=True)
        except Exception as exc:  # noqa: BLE001 - soundfile raises several types
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(f"cannot read the reference audio: {first}", path=path,
                             hint="use a WAV/FLAC/OGG file soundfile can open") from None
        if data.size == 0 or not np.all(np.isfinite(data)):
            raise InputError("the reference audio is empty or holds NaN/inf samples", path=path)
        if data.shape[1] != self.channels:
            data = np.repeat(data.mean(axis=1, keepdims=True), self.channels, axis=1)
        return np.stack([resample(data[:, c], int(rate), self.sample_rate)
                         for c in range(self.channels)])  # fmt: skip

    def encode(self, wave: np.ndarray) -> np.ndarray:
        """(frames, n_vq) codes of a (channels, T) clip."""
        if self._encode is None:
            self._encode = _session(self.codec.graphs["encode"], self.threads)
        wave = np.ascontiguousarray(wave[None], dtype=np.float32)
        lengths = np.array([wave.shape[2]], np.int32)
        out = _run(self._encode, {"waveform": wave, "input_lengths": lengths})
        frames = int(out["audio_code_lengths"][0])
        return np.asarray(out["audio_codes"][0, :frames], dtype=np.int64)

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)


class StreamDecoder:
    """One utterance's decode: frames in, audio out, the state carried between calls."""

    def __init__(self, runtime: NanoCodecRuntime):
        self._runtime = runtime
        self._state = initial_state(runtime.codec)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(channels, samples) float32 of (frames, n_vq) codes, after those decoded before."""
        codes = np.ascontiguousarray(codes[None], dtype=np.int32)
        lengths = np.array([codes.shape[1]], np.int32)
        feeds = {"audio_codes": codes, "audio_code_lengths": lengths, **self._state}
        out = _run(self._runtime._decode, feeds)
        self._state = next_state(self._runtime.codec, out)
        return np.asarray(out["audio"][0, :, : int(out["audio_lengths"][0])], dtype=np.float32)
