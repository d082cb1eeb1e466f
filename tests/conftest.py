"""Shared fixtures: the builtin checkpoints and what is made of them, built once per run and
shared by the xdist workers (tests/builds.py), the workers pinned to their CPUs, and the tests'
helpers (held runs, YAMLs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# _isolated_cache points MOSS_GGUF_CACHE at a folder of the run's; the llama.cpp tree is the
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


# the CPUs this run may use; an xdist worker is pinned to its share of them (pytest_configure)
RUN_CPUS: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0)))


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        # Every `python -m moss_gguf_cli` a test starts imports the package from source; this
        # machine sets PYTHONDONTWRITEBYTECODE, so without compiled files each start compiles
        # ~150 modules again (0.4 s of a 0.7 s start). Compiled once, by the controller only.
        import compileall

        compileall.compile_dir(REPO / "moss_gguf_cli", quiet=1)
    else:
        # Each worker (and every process it starts) on its own share of the CPUs: ggml's and
        # llama.cpp's thread pools size themselves by the cores a process may run on
        # (native/cpu_features.physical_cores), and two workers' pools spinning on the same
        # cores made a Nano test 1.5x slower. A test whose subject needs the whole machine
        # starts its process on RUN_CPUS (unpinned).
        index, count = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        share = RUN_CPUS[index % len(RUN_CPUS)::count] or RUN_CPUS
        os.sched_setaffinity(0, share)


# The files that keep a worker busiest (a minute and more each), handed out first: xdist gives
# the workers files in collection order, and a run that ends on one of them idles the other
# worker meanwhile. Within a file, and among the others, the order is pytest's.
SLOW_FIRST = ("test_quantize_direct.py", "test_delay_gguf.py", "test_hub_weights.py",
              "test_lora.py", "test_all.py", "test_convert.py", "test_dual.py", "test_family.py",
              "test_first_class_read.py", "test_push.py")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort


def unpinned() -> None:
    """A child's preexec_fn: the child runs on all of RUN_CPUS, as on a machine of its own."""
    os.sched_setaffinity(0, RUN_CPUS)


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder this run's workers share: pytest's base folder of the run (xdist gives each
    worker a folder inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def quantize_bin(llama_tree: Path) -> Path:
    """llama-quantize of the pinned llama.cpp tree."""
    from moss_gguf_cli.native import llama_tools

    exe = llama_tools.find_quantize_binary(llama_tree)
    assert exe is not None and exe.is_file()
    return exe


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builtin checkpoints go to a cache of this run's, also for CLI subprocesses; the workers
    of one run share it (source/tiny.build_cached renames a finished checkpoint into place)."""
    cache = run_root(tmp_path_factory) / "moss-gguf-cache"
    cache.mkdir(exist_ok=True)
    os.environ["MOSS_GGUF_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def builds(tmp_path_factory: pytest.TempPathFactory, _isolated_cache: Path):
    """The run's shared build cache (tests/builds.py): each folder built once, its digest
    checked when the session ends."""
    from builds import Builds

    cache = Builds(run_root(tmp_path_factory) / "builds")
    yield cache
    changed = cache.changed()
    assert not changed, f"a test changed a shared build (ask builds.copy for your own): {changed}"


@pytest.fixture(scope="session")
def tiny_model(_isolated_cache: Path) -> Path:
    from moss_gguf_cli.source.tiny import ensure_tiny

    return ensure_tiny("tiny")


@pytest.fixture(scope="session")
def tiny_extracted(builds, tiny_model: Path) -> Path:
    """builtin:tiny through `extract` (the run's shared build)."""
    from moss_gguf_cli.pipeline.extract import extract

    def make(out: Path) -> None:
        extract(tiny_model, out, source_model="builtin:tiny")

    return builds.make("tiny-extracted", make, str(tiny_model), leaf="tiny").path


@pytest.fixture(scope="session")
def odd_model(builds) -> Path:
    """A tiny delay checkpoint whose rows of 320 and 832 columns no 256 divides (832 not even
    64), in a folder named model (the name is in test_delay_gguf's golden files)."""
    from moss_gguf_cli.source.tiny import TinySpec, write_tiny

    def make(out: Path) -> None:
        out.mkdir()
        write_tiny(out, TinySpec(hidden=320, intermediate=832, heads=5, kv_heads=1, head_dim=64,
                                 n_vq=4))  # fmt: skip

    return builds.make("odd-model", make, leaf="model").path


# llama-quantize's types the byte-identity tests compare (test_quantize, test_quantize_direct)
QUANT_TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]


@pytest.fixture(scope="session")
def tiny_llama_quantized(builds, tiny_f16_gguf: Path, quantize_bin: Path) -> dict[str, Path]:
    """llama-quantize itself (not through moss-gguf) on the tiny f16 GGUF, a file a type."""

    def quantized(file_type: str) -> Path:
        def make(out: Path) -> None:
            done = subprocess.run([str(quantize_bin), str(tiny_f16_gguf), str(out), file_type],
                                  capture_output=True, text=True)  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]

        key = (str(tiny_f16_gguf), str(quantize_bin), file_type)
        return builds.make(f"llama-quantize-{file_type}", make, *key, leaf=f"{file_type}.gguf").path

    return {t: quantized(t) for t in QUANT_TYPES}


@pytest.fixture(scope="session")
def tiny_f16_gguf(builds, tiny_extracted: Path) -> Path:
    """builtin:tiny's backbone as an f16 GGUF, by the native converter: the same bytes from
    the checkpoint, the extraction or its backbone folder (test_convert checks it)."""
    return tiny_gguf(builds, tiny_extracted, "f16")


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


def tiny_gguf(builds, extracted: Path, outtype: str) -> Path:
    """The tiny backbone as a GGUF of OUTTYPE, converted once per run (a shared build)."""
    from moss_gguf_cli.pipeline.convert import convert

    def make(out: Path) -> None:
        convert(extracted, out, outtype=outtype)

    name = f"backbone_{outtype}.gguf"
    return builds.make(f"tiny-{outtype}", make, str(extracted), leaf=name).path


def write_yaml(path: Path, **values) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_weights(builds, tiny_extracted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weights folder as `all` lays it out (moss-tts.yaml: TINY_SYNTH_YAML), with links to
    the session's extraction: what `synth` and `serve` speak with."""
    import shutil

    from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec

    root = tmp_path_factory.mktemp("weights")
    (root / "backbone_f16.gguf").symlink_to(tiny_gguf(builds, tiny_extracted, "f16"))
    (root / "embeddings").symlink_to(tiny_extracted / "embeddings")
    (root / "lm_heads").symlink_to(tiny_extracted / "lm_heads")
    (root / "tokenizer").symlink_to(tiny_extracted / "qwen3_backbone")
    shutil.copy(tiny_extracted / "extraction_meta.json", root / "extraction_meta.json")
    ensure_tiny_codec(root / "audio_tokenizer")
    write_yaml(root / "moss-tts.yaml", **TINY_SYNTH_YAML)
    return root


@pytest.fixture(scope="session")
def q4_weights(builds, tiny_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_weights with its backbone quantized to Q4_K_M by the real command (the GGUF a
    shared build, the folder links and a YAML)."""
    import yaml

    f16 = (tiny_weights / "backbone_f16.gguf").resolve()

    def make(out: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "quantize", str(f16),
                               str(out), "Q4_K_M"], capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr

    q4 = builds.make("tiny-q4_k_m", make, str(f16), leaf="backbone_q4_k_m.gguf").path
    root = tmp_path_factory.mktemp("weights-q4")
    for item in tiny_weights.iterdir():
        if item.name != "moss-tts.yaml" and not item.name.endswith(".gguf"):
            (root / item.name).symlink_to(item.resolve())
    (root / q4.name).symlink_to(q4)
    config = yaml.safe_load((tiny_weights / "moss-tts.yaml").read_text())
    config["backbone_gguf"] = q4.name
    (root / "moss-tts.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
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

    from moss_gguf_cli.delay import SynthConfig, Synthesizer

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


@pytest.fixture(scope="session")
def tiny_first_class(builds) -> Path:
    """builtin:tiny as a first-class folder, F16 and Q8_0 (the run's shared build)."""
    return builds.all("--model", "builtin:tiny", "--format", "moss-tts-delay", "--quant", "F16",
                      "--quant", "Q8_0").path


@pytest.fixture(scope="session")
def tiny_nano_folder(builds) -> Path:
    """builtin:tiny-nano's folder (Q8_0, the tiny codec): the run's shared build."""
    return builds.all("--model", "builtin:tiny-nano").path


@pytest.fixture(scope="session")
def release_nano_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny Nano, written in the release's exact shape (tests/tiny_nano.py
    write_as_release: its config.json key for key with `"dtype": "float32"` over bf16 weights
    and its nulls, its tensor names, a tokenizer with its pieces 4-14 and byte offset,
    tokenizer_config.json and special_tokens_map.json; builtin:tiny-nano's dims), made into a
    folder with the tiny codec. `all` ran without --quiet: what it printed is kept beside the
    folder (all.stdout, all.stderr)."""
    from tiny_nano import write_as_release

    from moss_gguf_cli.nano.tiny import CONFIG, ensure_tiny_nano_codec_folder

    source = tmp_path_factory.mktemp("nano-release") / "release"
    write_as_release(source, CONFIG, seed=5)
    out = source.parent / "w"
    done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "all", "--model", str(source),
                           "--output", str(out), "--audio-tokenizer",
                           str(ensure_tiny_nano_codec_folder())], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    (source.parent / "all.stdout").write_text(done.stdout)
    (source.parent / "all.stderr").write_text(done.stderr)
    return out


def nano_yaml(folder: Path, name: str, tmp: Path, **values) -> Path:
    """FOLDER's moss-tts-nano.yaml with VALUES changed, as NAME in a copy of FOLDER under TMP
    (hard links: a shared build is never written to)."""
    import yaml
    from builds import Builds

    copy = tmp / f"{folder.name}-copy"
    if not copy.exists():
        Builds.copy(folder, copy)
    data = yaml.safe_load((folder / "moss-tts-nano.yaml").read_text())
    path = copy / name
    path.write_text(yaml.safe_dump({**data, **values}, sort_keys=False))
    return path
