"""Shared fixtures: the builtin tiny checkpoint and its extraction, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builtin checkpoints go to a per-session cache, also for CLI subprocesses."""
    cache = tmp_path_factory.mktemp("moss-gguf-cache")
    os.environ["MOSS_GGUF_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_model(_isolated_cache: Path) -> Path:
    from moss_gguf_cli.tiny import ensure_tiny

    return ensure_tiny("tiny")


@pytest.fixture(scope="session")
def tiny_extracted(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from moss_gguf_cli.extract import extract

    out = tmp_path_factory.mktemp("extracted") / "tiny"
    extract(tiny_model, out, source_model="builtin:tiny")
    return out


@pytest.fixture(scope="session")
def tiny_f16_gguf(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:tiny's backbone as an f16 GGUF, by the native converter."""
    from moss_gguf_cli.convert import convert

    out = tmp_path_factory.mktemp("gguf") / "backbone_f16.gguf"
    convert(tiny_model, out, outtype="f16")
    return out


@pytest.fixture(autouse=True)
def _package_logger_propagates():
    """CLI runs route the package logger to rich and stop propagation; caplog needs it back."""
    import logging

    yield
    logging.getLogger("moss_gguf_cli").propagate = True
