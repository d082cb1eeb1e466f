"""Shared fixtures: the builtin tiny checkpoint and its extraction, built once per session."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# _isolated_cache points MOSS_GGUF_CACHE at a per-session folder; the llama.cpp tree is the
# user's, so remember the value from before (import time).
_USER_CACHE = os.environ.get("MOSS_GGUF_CACHE")


@pytest.fixture(scope="session")
def llama_tree() -> Path:
    """The pinned llama.cpp tree with llama-quantize: $LLAMA_CPP_DIR, else get-llama-cpp.sh's.

    After scripts/install.sh --test the script only prints the cached tree's path.
    """
    env_dir = os.environ.get("LLAMA_CPP_DIR")
    if env_dir:
        return Path(env_dir)
    env = {k: v for k, v in os.environ.items() if k != "MOSS_GGUF_CACHE"}
    if _USER_CACHE:
        env["MOSS_GGUF_CACHE"] = _USER_CACHE
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "get-llama-cpp.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builtin checkpoints go to a per-session cache, also for CLI subprocesses."""
    cache = tmp_path_factory.mktemp("moss-gguf-cache")
    os.environ["MOSS_GGUF_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_model(_isolated_cache: Path) -> Path:
    from moss_gguf_cli.source.tiny import ensure_tiny

    return ensure_tiny("tiny")


@pytest.fixture(scope="session")
def tiny_extracted(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from moss_gguf_cli.pipeline.extract import extract

    out = tmp_path_factory.mktemp("extracted") / "tiny"
    extract(tiny_model, out, source_model="builtin:tiny")
    return out


@pytest.fixture(scope="session")
def tiny_f16_gguf(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:tiny's backbone as an f16 GGUF, by the native converter."""
    from moss_gguf_cli.pipeline.convert import convert

    out = tmp_path_factory.mktemp("gguf") / "backbone_f16.gguf"
    convert(tiny_model, out, outtype="f16")
    return out


@pytest.fixture(autouse=True)
def _package_logger_propagates():
    """CLI runs route the package logger to rich and stop propagation; caplog needs it back."""
    import logging

    yield
    logging.getLogger("moss_gguf_cli").propagate = True


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class HeldRun:
    """Starts a command that stops at a named hold point (moss_gguf_cli.hold_points), then returns.

    The process waits at the point until it is signalled, so a test that kills or interrupts
    it there does not depend on how fast the machine is.
    """

    def __init__(self, marker_dir: Path):
        self._dir = marker_dir
        self._procs: list[subprocess.Popen] = []

    def __call__(self, cmd: list[str], point: str, **popen) -> subprocess.Popen:
        from moss_gguf_cli.hold_points import ENV, POINTS

        assert point in POINTS, point
        marker = self._dir / f"{len(self._procs)}-{point}"
        env = {**os.environ, **popen.pop("env", {}), ENV: f"{point}={marker}"}
        # a test runner started in the background (`cmd &` in a script) ignores SIGINT, and
        # children inherit that: give the run the default disposition, as a terminal would
        popen.setdefault("preexec_fn", _default_sigint)
        proc = subprocess.Popen(cmd, env=env, **popen)
        self._procs.append(proc)
        deadline = time.monotonic() + 600  # a safety net against a hang, not a race
        while not marker.exists():
            if proc.poll() is not None:
                out = proc.communicate()[1] if popen.get("stderr") == subprocess.PIPE else ""
                raise AssertionError(f"exited {proc.returncode} before {point!r}: {out}")
            assert time.monotonic() < deadline, f"never reached {point!r}"
            time.sleep(0.01)
        assert int(marker.read_text()) == proc.pid
        return proc

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def held_run(tmp_path_factory: pytest.TempPathFactory):
    runner = HeldRun(tmp_path_factory.mktemp("holds"))
    yield runner
    runner.close()


# ---------------------------------------------------------------- a weights folder synth speaks

# the synth YAML of the tiny weights folder (paths relative to it)
TINY_SYNTH_YAML = {
    "backbone_gguf": "backbone_f16.gguf",
    "embedding_dir": "embeddings",
    "lm_head_dir": "lm_heads",
    "tokenizer_dir": "tokenizer",
    "audio_backend": "onnx",
    "audio_encoder_onnx": "audio_tokenizer/encoder.onnx",
    "audio_decoder_onnx": "audio_tokenizer/decoder.onnx",
    "heads_backend": "auto",
    "n_ctx": 1024,
    "n_batch": 128,
    "n_threads": 1,  # a shared 2-core box: spinning thread pools stall when oversubscribed
    "max_new_tokens": 48,  # a few frames; the random model never says <|im_end|> on its own
    "flash_attn": False,
}


def tiny_gguf(extracted: Path, outtype: str) -> Path:
    """The tiny backbone as a GGUF, converted once per session beside the extraction."""
    from moss_gguf_cli.pipeline.convert import convert

    out = extracted.parent / f"tiny-backbone-{outtype}.gguf"
    if not out.is_file():
        convert(extracted, out, outtype=outtype)
    return out


def write_yaml(path: Path, **values) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_weights(tiny_extracted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weights folder as `all` lays it out (moss-tts.yaml: TINY_SYNTH_YAML), with links to
    the session's extraction: what `synth` and `serve` speak with."""
    import shutil

    from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec

    root = tmp_path_factory.mktemp("weights")
    (root / "backbone_f16.gguf").symlink_to(tiny_gguf(tiny_extracted, "f16"))
    (root / "embeddings").symlink_to(tiny_extracted / "embeddings")
    (root / "lm_heads").symlink_to(tiny_extracted / "lm_heads")
    (root / "tokenizer").symlink_to(tiny_extracted / "qwen3_backbone")
    shutil.copy(tiny_extracted / "extraction_meta.json", root / "extraction_meta.json")
    ensure_tiny_codec(root / "audio_tokenizer")
    write_yaml(root / "moss-tts.yaml", **TINY_SYNTH_YAML)
    return root


@pytest.fixture(scope="session")
def reference_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A voice to clone: 0.9 s of a modulated 220 Hz tone, stereo at 16 kHz (so it is mixed
    down and resampled to 24 kHz on the way in)."""
    import numpy as np
    import soundfile as sf

    t = np.arange(int(16000 * 0.9)) / 16000
    wav = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    path = tmp_path_factory.mktemp("ref") / "voice.wav"
    sf.write(path, np.stack([wav, wav * 0.8], axis=1), 16000)
    return path


def assert_speak_alike(folders, text: str) -> None:
    """The folders speak TEXT greedily with the same rows and the same waveform."""
    import numpy as np

    from moss_gguf_cli.tts import SynthConfig, Synthesizer

    results = []
    for folder in folders:
        config = SynthConfig.from_yaml(folder / "moss-tts.yaml").override(
            text_temperature=0.0, audio_temperature=0.0, max_new_tokens=60
        )
        with Synthesizer(config) as tts:
            results.append(tts.synthesize(text))
    first = results[0]
    assert first.rows.size > 0 and first.waveform.size > 0
    for other in results[1:]:
        np.testing.assert_array_equal(first.rows, other.rows)
        np.testing.assert_array_equal(first.waveform, other.waveform)


def _nano_all(model: str, out: Path, *args: str) -> Path:
    """`moss-gguf all` on a Nano input, as a user runs it."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", model, "--output", str(out),
           "-q", *args]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="session")
def tiny_nano_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:tiny-nano's folder (Q8_0, the tiny codec)."""
    return _nano_all("builtin:tiny-nano", tmp_path_factory.mktemp("nano") / "w")


@pytest.fixture(scope="session")
def release_nano_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny Nano, written as the release writes it (torch.save's pytorch_model.bin,
    each head one storage with its table, bf16; builtin:tiny-nano's dims and tokenizer), made
    into a folder with the tiny codec."""
    import shutil

    import torch
    from tiny_nano import release_state, write_release

    from moss_gguf_cli.nano.tiny import CONFIG, ensure_tiny_nano, ensure_tiny_nano_codec_folder

    source = tmp_path_factory.mktemp("nano-release") / "release"
    write_release(source, CONFIG, release_state(CONFIG, torch.bfloat16, seed=5))
    shutil.copyfile(ensure_tiny_nano() / "tokenizer.model", source / "tokenizer.model")
    return _nano_all(str(source), source.parent / "w", "--audio-tokenizer",
                     str(ensure_tiny_nano_codec_folder()))  # fmt: skip


def nano_yaml(folder: Path, name: str, **values) -> Path:
    """A copy of FOLDER's moss-tts-nano.yaml (beside it) with VALUES changed."""
    import yaml

    data = yaml.safe_load((folder / "moss-tts-nano.yaml").read_text())
    path = folder / name
    path.write_text(yaml.safe_dump({**data, **values}, sort_keys=False))
    return path
