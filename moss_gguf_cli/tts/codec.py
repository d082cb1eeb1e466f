"""The audio tokenizer (MOSS-Audio-Tokenizer ONNX) and the audio plumbing around it.

Contract (docs/ARCHITECTURE.md §5), inputs and outputs used by position since their names may
be auto-generated: ``decoder.onnx`` (codes int64 (32, B, T), n_quantizers int64
scalar) → (audio float32 (B, 1, samples), lengths int64 (B,)); ``encoder.onnx``
(audio float32 (B, 1, samples), n_quantizers) → (codes int64 (32, B, T), lengths).
24 kHz, 1920 samples per frame. A model with fewer codebooks pads the codes to 32
rows and passes n_quantizers = n_vq. Weights may sit in external ``.data`` files
beside the ``.onnx`` (onnxruntime finds them relative to the model file).

Reference audio: any format soundfile reads, mixed to mono, resampled to 24 kHz,
loudness-normalised, padded to a whole number of frames.

Resampling is our own polyphase windowed-sinc filter (Kaiser window, beta 8.6,
16 zero crossings each side, cut-off at the lower of the two Nyquist rates): for a
rational ratio up/down every output sample uses one of `up` precomputed 32-tap
kernels. Good to about −80 dB, plenty for a voice reference.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from ..errors import InputError, ToolError
from ..source.codec_contract import check_signature

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920
CODEBOOKS = 32
TARGET_DBFS = -20.0
GAIN_RANGE_DB = (-3.0, 3.0)


# ---------------------------------------------------------------- audio helpers


def loudness_gain(wav: np.ndarray) -> np.float32:
    """The factor that brings WAV's RMS to −20 dBFS, limited to ±3 dB (as the upstream
    processor does); 1 for an empty WAV.

    The level is measured in float32 throughout (mean square, + 1e-9, square root,
    20·log10), as upstream's llama.cpp backend measures it: a float64 level moves the
    gain, and so every output sample, by an ulp whenever the gain is not clamped."""
    wav = np.asarray(wav, dtype=np.float32)
    f32 = np.float32
    if wav.size == 0:
        return f32(1.0)
    rms = np.sqrt(np.mean(np.square(wav), dtype=f32) + f32(1e-9))
    current = f32(20.0) * np.log10(rms)
    gain = float(f32(TARGET_DBFS) - current)
    gain = min(max(gain, GAIN_RANGE_DB[0]), GAIN_RANGE_DB[1])
    return f32(10.0 ** (gain / 20.0))


def loudness_normalize(wav: np.ndarray) -> np.ndarray:
    """WAV times its `loudness_gain`."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.size == 0:
        return wav
    return (wav * loudness_gain(wav)).astype(np.float32)


def _kernel_table(up: int, down: int, zeros: int = 16, beta: float = 8.6) -> tuple[np.ndarray, int]:
    """(up, 2·half) windowed-sinc taps, one row per output phase, and half."""
    cutoff = min(1.0, up / down)  # relative to the input Nyquist
    half = int(math.ceil(zeros / cutoff))
    taps = np.arange(-half + 1, half + 1, dtype=np.float64)
    phases = (np.arange(up, dtype=np.int64) * down % up) / up  # fractional input offset
    x = taps[None, :] - phases[:, None]
    window = np.i0(beta * np.sqrt(np.clip(1.0 - (x / half) ** 2, 0.0, 1.0))) / np.i0(beta)
    kernel = cutoff * np.sinc(cutoff * x) * window
    return kernel.astype(np.float32), half


def _filtered(padded: np.ndarray, n: np.ndarray, up: int, down: int, table: np.ndarray,
              half: int, origin: int = 0) -> np.ndarray:  # fmt: skip
    """Outputs N (consecutive) from PADDED, whose element 0 is padded index ORIGIN: each the
    dot of its phase's taps with the 2·half inputs around its time. An integer decimation (up
    1, e.g. 48 kHz to 24 kHz) reads its windows as a strided view instead of gathering a copy:
    the same products summed in the same order (the same bits), a tenth of the time."""
    if up == 1:
        first = int(n[0]) * down + 1 - origin
        windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half)[first::down]
        windows = windows[: n.size]
        return np.einsum("ij,ij->i", windows, np.broadcast_to(table[0], windows.shape))
    base, phase = (n * down) // up, n % up  # the input sample at or before each output time
    offsets = np.arange(-half + 1, half + 1)
    return np.einsum("ij,ij->i", padded[base[:, None] + half + offsets[None, :] - origin],
                     table[phase])  # fmt: skip


def resample(wav: np.ndarray, rate_in: int, rate_out: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of a 1-D signal (polyphase windowed sinc)."""
    wav = np.asarray(wav, dtype=np.float32)
    if rate_in == rate_out or wav.size == 0:
        return wav
    g = math.gcd(int(rate_in), int(rate_out))
    up, down = rate_out // g, rate_in // g
    table, half = _kernel_table(up, down)
    n_out = int(math.ceil(wav.size * up / down))
    padded = np.concatenate([np.zeros(half, np.float32), wav, np.zeros(half + 1, np.float32)])
    out = np.empty(n_out, dtype=np.float32)
    chunk = max(1, (1 << 22) // table.shape[1])
    for start in range(0, n_out, chunk):
        n = np.arange(start, min(n_out, start + chunk), dtype=np.int64)
        out[start : start + n.size] = _filtered(padded, n, up, down, table, half)
    return out


class StreamResampler:
    """`resample` fed piece by piece: each output sample is computed as `resample` computes
    it, from the same input samples, once the input it needs has arrived; `end` pads the
    input's end with zeros as `resample` does. However the input is cut, the output is the
    same samples."""

    def __init__(self, rate_in: int, rate_out: int):
        g = math.gcd(int(rate_in), int(rate_out))
        self.up, self.down = rate_out // g, rate_in // g
        self._table, self._half = _kernel_table(self.up, self.down)
        self._buf = np.zeros(self._half, np.float32)  # the padded input not yet consumed
        self._start = 0  # padded index of _buf[0]
        self._seen = 0  # input samples received
        self._made = 0  # output samples made

    def _emit(self, last: int) -> np.ndarray:
        """Outputs _made..LAST-1, from _buf."""
        up, down = self.up, self.down
        n = np.arange(self._made, last, dtype=np.int64)
        if n.size == 0:
            return np.zeros(0, np.float32)
        out = _filtered(self._buf, n, up, down, self._table, self._half, self._start)
        out = out.astype(np.float32)
        self._made = last
        keep = (last * down) // up + 1 - self._start  # the next output's window starts here
        self._buf, self._start = self._buf[keep:], self._start + keep
        return out

    def feed(self, piece: np.ndarray) -> np.ndarray:
        """The output samples PIECE (1-D) completes."""
        piece = np.asarray(piece, dtype=np.float32).reshape(-1)
        self._buf = np.concatenate([self._buf, piece])
        self._seen += piece.size
        # output n needs the input up to index n·down//up + half
        ready = ((self._seen - self._half) * self.up + self.up - 1) // self.down
        total = -(-self._seen * self.up // self.down)
        return self._emit(max(self._made, min(ready, total)))

    def end(self) -> np.ndarray:
        """The rest of the output, the input's end padded with zeros."""
        self._buf = np.concatenate([self._buf, np.zeros(self._half + 1, np.float32)])
        return self._emit(-(-self._seen * self.up // self.down))


def read_reference(path: Path, loudness: bool = True) -> np.ndarray:
    """A reference recording as 24 kHz mono float32, loudness-normalised unless LOUDNESS is
    False (clips joined before encoding are normalised once, joined, as upstream does)."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise InputError("reference audio not found", path=path)
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError / TypeError
        raise InputError(
            f"cannot read the reference audio: {str(exc).splitlines()[0] if str(exc) else exc}",
            path=path,
            hint="use a WAV/FLAC/OGG file soundfile can open",
        ) from exc
    if data.size == 0:
        raise InputError("the reference audio is empty", path=path)
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if not np.all(np.isfinite(mono)):
        raise InputError("the reference audio holds NaN/inf samples", path=path)
    wav = resample(mono, int(rate), SAMPLE_RATE)
    return loudness_normalize(wav) if loudness else wav


def pad_to_frames(wav: np.ndarray) -> np.ndarray:
    rest = (-wav.size) % FRAME_SAMPLES
    return np.concatenate([wav, np.zeros(rest, dtype=np.float32)]) if rest else wav


# ---------------------------------------------------------------- the ONNX tokenizer


def _providers(use_gpu: bool) -> list[str]:
    import onnxruntime as ort

    if use_gpu and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if use_gpu:
        log.info("use_gpu_audio: onnxruntime has no CUDA provider here; using the CPU")
    return ["CPUExecutionProvider"]


def _check_signature(session, path: Path, role: str) -> None:
    ins = [(a.type, a.shape) for a in session.get_inputs()]
    outs = [(a.type, a.shape) for a in session.get_outputs()]
    check_signature(ins, outs, path, role)


class AudioCodec:
    """encode(24 kHz wav) → codes (T, n_vq); decode(codes (T, n_vq)) → 24 kHz wav."""

    def __init__(
        self,
        decoder: Path,
        encoder: Path | None = None,
        n_vq: int = CODEBOOKS,
        use_gpu: bool = False,
        n_threads: int = 0,
    ):
        if not 1 <= n_vq <= CODEBOOKS:
            raise InputError(f"n_vq {n_vq} is outside 1..{CODEBOOKS} of the audio tokenizer")
        self.n_vq = n_vq
        self.decoder_path = Path(decoder)
        self.encoder_path = Path(encoder) if encoder is not None else None
        self.use_gpu = use_gpu
        self.n_threads = n_threads
        self._decoder = self._open(self.decoder_path, "decoder")
        self._encoder = None

    def _open(self, path: Path, role: str):
        try:
            import onnxruntime as ort
        except Exception as exc:  # noqa: BLE001
            raise ToolError(
                f"onnxruntime does not import: {exc}", hint="pip install onnxruntime"
            ) from exc
        if not path.is_file():
            raise InputError(f"audio {role} not found", path=path, hint=f"check audio_{role}_onnx")
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only; its warnings are not the user's business
        if self.n_threads:
            options.intra_op_num_threads = self.n_threads
        try:
            session = ort.InferenceSession(
                str(path), sess_options=options, providers=_providers(self.use_gpu)
            )
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(
                f"onnxruntime cannot load the audio {role}: {first}",
                path=path,
                hint="is the .onnx complete, with its .data file beside it?",
            ) from exc
        _check_signature(session, path, role)
        return session

    def _feeds(self, session, first: np.ndarray) -> dict[str, np.ndarray]:
        ins = session.get_inputs()
        count = np.array(self.n_vq, dtype=np.int64)
        if ins[1].shape is not None and len(ins[1].shape) == 1:
            count = count.reshape(1)
        return {ins[0].name: first, ins[1].name: count}

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(T, n_vq) codes → float32 waveform of T × 1920 samples."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.ndim != 2 or codes.shape[1] != self.n_vq:
            raise InputError(f"codes have shape {codes.shape}, expected (T, {self.n_vq})")
        frames = codes.shape[0]
        if frames == 0:
            return np.zeros(0, dtype=np.float32)
        full = np.zeros((CODEBOOKS, 1, frames), dtype=np.int64)
        full[: self.n_vq, 0, :] = codes.T
        try:
            outputs = self._decoder.run(None, self._feeds(self._decoder, full))
        except Exception as exc:  # noqa: BLE001 - onnxruntime's runtime failures
            raise ToolError(
                f"the audio decoder failed: {str(exc).splitlines()[0]}", path=self.decoder_path
            ) from exc
        audio = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
        if len(outputs) > 1:
            length = int(np.asarray(outputs[1]).reshape(-1)[0])
            audio = audio[: max(0, length)]
        return audio

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """24 kHz mono float32 → (T, n_vq) codes."""
        if self._encoder is None:
            if self.encoder_path is None:
                raise InputError(
                    "voice cloning needs the audio encoder",
                    hint="set audio_encoder_onnx in the config",
                )
            self._encoder = self._open(self.encoder_path, "encoder")
        wav = pad_to_frames(np.asarray(wav, dtype=np.float32).reshape(-1))
        if wav.size == 0:
            raise InputError("the reference audio is empty")
        try:
            outputs = self._encoder.run(None, self._feeds(self._encoder, wav.reshape(1, 1, -1)))
        except Exception as exc:  # noqa: BLE001
            raise ToolError(
                f"the audio encoder failed: {str(exc).splitlines()[0]}", path=self.encoder_path
            ) from exc
        codes = np.asarray(outputs[0], dtype=np.int64)
        if codes.ndim != 3 or codes.shape[0] < self.n_vq:
            raise ToolError(
                f"the audio encoder returned codes of shape {codes.shape}", path=self.encoder_path
            )
        frames = codes.shape[2]
        if len(outputs) > 1:
            frames = min(frames, int(np.asarray(outputs[1]).reshape(-1)[0]))
        return np.ascontiguousarray(codes[: self.n_vq, 0, :frames].T)
