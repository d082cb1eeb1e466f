"""One engine vocabulary (moss_gguf_cli/quantize/engines.py): every name `all --engine` and
`quantize --engine` accept, the one chooser, and doctor's pre-flight, which all ask it; an
unknown name is one line naming the choices, before any work."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_all import statuses
from test_quantize import write_small_gguf
from typer.testing import CliRunner

from moss_gguf_cli.cli.app import app
from moss_gguf_cli.doctor.preflight import preflight
from moss_gguf_cli.errors import UsageError
from moss_gguf_cli.quantize.engines import (
    Engine,
    checked_as,
    choose_engine,
    direct_unavailable,
    parse_engine,
)

NAMES = ["auto", "direct", "binary", "library"]
runner = CliRunner()


def test_the_vocabulary_is_these_four_names() -> None:
    assert [e.value for e in Engine] == NAMES
    assert direct_unavailable() is None  # the test install runs every engine


@pytest.mark.parametrize("name", NAMES + ["LIBRARY"])
def test_every_name_parses(name: str) -> None:
    assert parse_engine(name) is Engine(name.lower())


def test_an_unknown_name_names_the_choices() -> None:
    with pytest.raises(UsageError, match="unknown engine 'bogus'") as err:
        parse_engine("bogus")
    assert err.value.hint == "choose auto, direct, binary, library"


@pytest.mark.parametrize(
    ("name", "from_checkpoint", "from_gguf"),
    [
        ("auto", Engine.DIRECT, Engine.BINARY),
        ("direct", Engine.DIRECT, None),
        ("binary", Engine.BINARY, Engine.BINARY),
        ("library", Engine.LIBRARY, Engine.LIBRARY),
    ],
)
def test_the_chooser(name: str, from_checkpoint, from_gguf, llama_tree: Path) -> None:
    choice = choose_engine(name, llama_tree, checkpoint=True)
    assert choice.engine is from_checkpoint
    assert choice.from_checkpoint is (from_checkpoint is Engine.DIRECT)
    assert (choice.binary is not None) is (from_checkpoint is Engine.BINARY)
    if from_gguf is None:  # `quantize` reads a GGUF: the direct engine reads a checkpoint
        with pytest.raises(UsageError, match="direct engine cannot quantize a GGUF"):
            choose_engine(name, llama_tree, checkpoint=False)
    else:
        assert choose_engine(name, llama_tree, checkpoint=False).engine is from_gguf


@pytest.mark.parametrize(
    ("name", "checked"),
    [("auto", Engine.LIBRARY), ("direct", Engine.LIBRARY), ("binary", Engine.BINARY),
     ("library", Engine.LIBRARY)],
)  # fmt: skip
def test_preflight_checks_what_the_chosen_engine_needs(
    name: str, checked: Engine, llama_tree: Path, tmp_path: Path
) -> None:
    # the direct engine runs libllama's dry run: pre-flight checks it as the library engine
    assert checked_as(name, checkpoint=True) is checked
    preflight(
        needs_quantize=True, output=tmp_path / "o", needed_bytes=1, llama_cpp=llama_tree,
        engine=name, from_checkpoint=True,
    )  # fmt: skip


def test_preflight_refuses_what_the_vocabulary_refuses(llama_tree: Path) -> None:
    kw = dict(needs_quantize=True, output=None, needed_bytes=None, llama_cpp=llama_tree)
    with pytest.raises(UsageError, match="unknown engine 'bogus'"):
        preflight(engine="bogus", from_checkpoint=True, **kw)
    with pytest.raises(UsageError, match="direct engine cannot quantize a GGUF"):
        preflight(engine="direct", **kw)


@pytest.mark.parametrize("name", ["direct", "bogus"])
def test_quantize_command_refuses_a_name_it_cannot_run(name: str, tmp_path: Path) -> None:
    src = write_small_gguf(tmp_path / "small_f16.gguf")
    res = runner.invoke(app, ["quantize", str(src), "q8_0", "--engine", name, "--dry-run"])
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) <= 2 and "engine" in lines[0], res.output  # the error, then the fix
    assert "choose auto, binary, library" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small_f16.gguf"]


def all_cli(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", "all", "--model", "builtin:tiny",
         "--output", str(out), *extra],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def by_auto(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("auto") / "w"
    done = all_cli(out, "--engine", "auto")
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("name", ["direct", "binary", "library"])
def test_all_with_each_engine_makes_the_same_bytes(
    name: str, by_auto: Path, llama_tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "w"
    done = all_cli(out, "--engine", name, "--llama-cpp", str(llama_tree))
    assert done.returncode == 0, done.stderr
    # only the two-pass engines convert to an f16 GGUF first
    assert statuses(done.stdout)["convert"] == ("skipped" if name == "direct" else "done")
    gguf = "backbone_q4_k_m.gguf"
    assert filecmp.cmp(out / gguf, by_auto / gguf, shallow=False)


def test_all_with_an_unknown_engine_stops_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "w"
    done = all_cli(out, "--engine", "bogus")
    assert done.returncode != 0
    assert "unknown engine 'bogus'" in done.stderr and "choose auto, direct, binary" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []
