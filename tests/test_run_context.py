"""`all` resolves once, into its run context: the checkpoint is opened once per run, and every
step takes it from there (docs/ARCHITECTURE.md §7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moss_gguf_cli.pipeline.run import AllSettings, run_all
from moss_gguf_cli.source import checkpoint


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folder of every checkpoint opened from now on (the real opening, counted)."""
    folders: list[Path] = []
    real = checkpoint.MossCheckpoint.__init__

    def counted(self, root: Path, *args, **kwargs) -> None:
        folders.append(Path(root))
        real(self, root, *args, **kwargs)

    monkeypatch.setattr(checkpoint.MossCheckpoint, "__init__", counted)
    return folders


@pytest.mark.parametrize("engine", ["direct", "library"])
def test_the_checkpoint_is_opened_once_per_run(
    engine: str, opened: list[Path], tmp_path: Path
) -> None:
    # direct: extract and quantize read it; library: extract, convert and quantize's plan
    settings = AllSettings(model="builtin:tiny", output=tmp_path / "w", engine=engine)
    result = run_all(settings)
    assert {s.name: s.status for s in result.steps}["extract"] == "done"
    assert len(opened) == 1, opened
    again = run_all(settings)  # a finished folder: only verify runs, nothing is opened
    assert [s.status for s in again.steps].count("done") == 1
    assert len(opened) == 1, opened


def test_the_count_sees_an_opening(opened: list[Path], tiny_model: Path) -> None:
    checkpoint.open_checkpoint(tiny_model)
    checkpoint.as_checkpoint(tiny_model)
    assert opened == [tiny_model, tiny_model]
    assert checkpoint.as_checkpoint(ck := checkpoint.open_checkpoint(tiny_model)) is ck
    assert len(opened) == 3
