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
