"""`all` drops each source range from the page cache once every reader is past it, and
nothing a reader did not announce."""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

from test_sinks import resident_pages

from moss_gguf_cli.disk.page_cache import DROP_STEP, SourcePages
from moss_gguf_cli.pipeline.run import AllSettings, run_all
from moss_gguf_cli.source.checkpoint import open_checkpoint
from moss_gguf_cli.source.tables import npy_jobs

MB = 1 << 20


def _recording() -> tuple[SourcePages, list[tuple[int, int]]]:
    drops: list[tuple[int, int]] = []
    return SourcePages(drop=lambda path, off, n: drops.append((off, n))), drops


def test_a_range_is_dropped_only_behind_every_reader(tmp_path: Path) -> None:
    f = tmp_path / "src.bin"
    f.touch()
    pages, drops = _recording()
    size = 3 * DROP_STEP + 5
    pages.expect("extract", [(f, 1000, size)])
    pages.expect("convert", [(f, 1000, size)])
    extract = pages.reader("extract", f, 1000, size)
    convert = pages.reader("convert", f, 1000, size)
    extract(2 * DROP_STEP)
    assert drops == []  # convert has not read any of it yet
    convert(DROP_STEP // 2)
    assert drops == []  # less than a step behind both
    convert(DROP_STEP + 7)
    assert drops == [(1000, DROP_STEP + 7)]
    extract(size)
    convert(size)  # the rest, at the range's end whatever its length
    assert drops == [(1000, DROP_STEP + 7), (1000 + DROP_STEP + 7, size - DROP_STEP - 7)]
    convert(size)
    assert len(drops) == 2


def test_unannounced_readers_and_ranges_drop_nothing(tmp_path: Path) -> None:
    f = tmp_path / "src.bin"
    f.touch()
    pages, drops = _recording()
    pages.expect("convert", [(f, 0, 10 * MB)])
    pages.reader("extract", f, 0, 10 * MB)(10 * MB)  # not announced for this range
    pages.reader("convert", f, 4096, 10 * MB)(10 * MB)  # a range nobody announced
    assert drops == []
    link = tmp_path / "link.bin"
    link.symlink_to(f)  # a Hub snapshot's files are links to blobs: the same range
    pages.reader("convert", link, 0, 10 * MB)(10 * MB)
    assert drops == [(0, 10 * MB)]


def _cached_source(tiny_model: Path, dest: Path) -> Path:
    shutil.copytree(tiny_model, dest)
    os.sync()  # written back: clean pages, which a drop removes at once
    for shard in dest.glob("*.safetensors"):
        shard.read_bytes()  # all of it cached, as right after a download
        assert all(resident_pages(shard))
    return dest


def _resident_share_of_tensors(model: Path) -> float:
    """Share of the pages wholly inside tensors that extract or convert read, still cached."""
    ck = open_checkpoint(model)
    inside: dict[Path, set[int]] = {}
    for ref in [j.source for j in npy_jobs(ck)] + [r for _, r in ck.backbone_tensors()]:
        first = -(-ref.offset // mmap.PAGESIZE)
        inside.setdefault(ref.path, set()).update(
            range(first, (ref.offset + ref.nbytes) // mmap.PAGESIZE)
        )
    total = sum(len(v) for v in inside.values())
    assert total > 10_000
    cached = 0
    for shard, pages in inside.items():
        resident = resident_pages(shard)
        cached += sum(resident[i] for i in pages)
        assert resident[0], "the header is not a tensor: it stays"
    return cached / total


def test_all_leaves_the_source_tensors_out_of_the_page_cache(
    tiny_model: Path, tmp_path: Path
) -> None:
    model = _cached_source(tiny_model, tmp_path / "model")
    run_all(
        AllSettings(
            model=str(model), output=tmp_path / "weights", file_types=["Q8_0"],
            audio_tokenizer="none",
        )
    )
    # verify's sampled comparison with the source reads back the first rows of each tensor
    assert _resident_share_of_tensors(model) < 0.05


def test_keep_intermediate_leaves_the_source_cached(tiny_model: Path, tmp_path: Path) -> None:
    # extract then also copies the backbone, a reader the tracker does not follow
    model = _cached_source(tiny_model, tmp_path / "model")
    settings = AllSettings(
        model=str(model), output=tmp_path / "weights", file_types=["Q8_0"], keep_intermediate=True,
        audio_tokenizer="none",
    )
    run_all(settings)
    assert _resident_share_of_tensors(model) > 0.95
