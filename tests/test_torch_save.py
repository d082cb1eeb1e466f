"""source/torch_save.py: a state dict written in torch.save's format without torch, proven by
torch's own reader (torch.load with weights_only=True, and with mmap, which needs the storages
aligned) and by ours (source/torch_pickle.py), bit for bit, tied storage kept."""

from __future__ import annotations

import struct
import zipfile

import ml_dtypes
import numpy as np
import pytest
import torch

from moss_gguf_cli.source.torch_pickle import read_state_dict
from moss_gguf_cli.source.torch_save import ALIGN, TOP, write_state_dict

TORCH = {np.dtype(np.float32): torch.float32, np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
         np.dtype(np.float16): torch.float16, np.dtype(np.int64): torch.int64}  # fmt: skip


def state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    table = rng.standard_normal((12, 8)).astype(ml_dtypes.bfloat16)
    return {
        "wte.weight": table,
        "fc.weight": rng.standard_normal((6, 8)).astype(np.float32),
        "fc.bias": rng.standard_normal(6).astype(np.float16),
        "head.weight": table,  # tied: the same object, one storage
        "steps": np.array([2**40, -3], dtype=np.int64),  # beyond 32 bits
        "scalar": np.array(1.5, dtype=np.float32),  # 0-d
    }


def bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("mmap", [False, True])
def test_torch_load_reads_it_back_bit_exact_with_ties(tmp_path, mmap):
    path = write_state_dict(tmp_path / "pytorch_model.bin", state())
    loaded = torch.load(path, weights_only=True, mmap=mmap)
    assert list(loaded) == list(state())
    for name, array in state().items():
        tensor = loaded[name]
        assert tensor.dtype == TORCH[array.dtype] and tuple(tensor.shape) == array.shape, name
        assert tensor.reshape(-1).view(torch.uint8).numpy().tobytes() == bits(array), name
    assert loaded["wte.weight"].data_ptr() == loaded["head.weight"].data_ptr()
    assert loaded["wte.weight"].data_ptr() != loaded["fc.weight"].data_ptr()


def test_our_reader_reads_it_back_with_ties(tmp_path):
    path = write_state_dict(tmp_path / "pytorch_model.bin", state())
    read = read_state_dict(path)
    assert {n: bits(a) for n, a in read.tensors.items()} == {n: bits(a) for n, a in
                                                             state().items()}  # fmt: skip
    assert read.tied() == {"0": ["wte.weight", "head.weight"]}


def test_the_zip_is_laid_out_as_torch_lays_it_out(tmp_path):
    path = write_state_dict(tmp_path / "pytorch_model.bin", state())
    with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
        names = archive.namelist()
        assert names[0] == f"{TOP}/data.pkl" and names[-1] == f"{TOP}/version"
        assert sorted(n for n in names if "/data/" in n) == [f"{TOP}/data/{k}" for k in "01234"]
        for info in archive.infolist():
            raw.seek(info.header_offset + 26)
            name_len, extra_len = struct.unpack("<HH", raw.read(4))
            assert (info.header_offset + 30 + name_len + extra_len) % ALIGN == 0, info.filename
            assert info.compress_type == zipfile.ZIP_STORED


def test_a_view_that_is_not_contiguous_is_refused(tmp_path):
    with pytest.raises(ValueError, match="transposed"):
        write_state_dict(tmp_path / "x.bin", {"transposed": np.ones((3, 4), np.float32).T})
