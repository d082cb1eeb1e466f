"""A state dict written in torch.save's zip format without torch (the builtin tiny Nano's
`pytorch_model.bin`: users have no torch, and the release's file is this format).

The zip (`TOP/data.pkl`, `TOP/byteorder`, `TOP/data/KEY`, `TOP/version`, TOP `archive` as
torch names it for a file object) is what source/torch_pickle.py reads. The pickle is protocol 2
written opcode by opcode here rather than by `pickle.Pickler`, which would import `torch` to
check the globals it names: an OrderedDict whose values are
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`, each
storage a persistent id `('storage', torch.XStorage, key, 'cpu', numel)`. Arrays that are one
object (tied weights) are written as one storage that both names view, as torch.save does.
Each storage's bytes start at a multiple of 64 in the file, as torch aligns them (mmap loads).
"""

from __future__ import annotations

import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np

from .torch_pickle import STORAGE_DTYPES

TOP = "archive"
FORMAT_VERSION = b"3\n"  # torch's zip format version for data/ entries named by key
ALIGN = 64
_STORAGE_OF = {dtype: name for name, dtype in STORAGE_DTYPES.items()}
_PAD_ID = 0x4246  # the extra field id torch pads local headers with ("FB")


def _global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode("ascii")


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw


def _int(value: int) -> bytes:
    if -(2**31) <= value < 2**31:
        return pickle.BININT + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(raw)]) + raw


def _tuple(items: list[bytes]) -> bytes:
    return pickle.EMPTY_TUPLE if not items else pickle.MARK + b"".join(items) + pickle.TUPLE


_ORDERED_DICT = _global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE


def _tensor(key: str, array: np.ndarray) -> bytes:
    storage = _STORAGE_OF[array.dtype]
    pid = _tuple([_text("storage"), _global("torch", storage), _text(key), _text("cpu"),
                  _int(array.size)])  # fmt: skip
    stride, step = [], 1
    for n in reversed(array.shape):  # C order, in elements
        stride.insert(0, step)
        step *= n
    args = [pid + pickle.BINPERSID, _int(0), _tuple([_int(n) for n in array.shape]),
            _tuple([_int(s) for s in stride]), pickle.NEWFALSE, _ORDERED_DICT]  # fmt: skip
    return _global("torch._utils", "_rebuild_tensor_v2") + _tuple(args) + pickle.REDUCE


def state_dict_pickle(tensors: dict[str, np.ndarray]) -> tuple[bytes, dict[str, np.ndarray]]:
    """The data.pkl bytes for TENSORS and the storages it names (key → array)."""
    keys: dict[int, str] = {}
    storages: dict[str, np.ndarray] = {}
    items = []
    for name, array in tensors.items():
        if array.dtype not in _STORAGE_OF or not array.flags.c_contiguous:
            raise ValueError(f"{name}: not a C-contiguous array of a torch storage's dtype")
        key = keys.setdefault(id(array), str(len(keys)))
        storages[key] = array
        items.append(_text(name) + _tensor(key, array))
    body = pickle.MARK + b"".join(items) + pickle.SETITEMS if items else b""
    return pickle.PROTO + b"\x02" + _ORDERED_DICT + body + pickle.STOP, storages


def _aligned(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    """DATA stored under NAME with its first byte at a multiple of ALIGN in the file."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    start = archive.fp.tell() + 30 + len(name.encode("utf-8")) + 4  # header + name + pad id
    info.extra = struct.pack("<HH", _PAD_ID, -start % ALIGN) + b"Z" * (-start % ALIGN)
    archive.writestr(info, data)


def write_state_dict(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Write TENSORS (C-contiguous arrays; one object under several names is one storage) at
    PATH as torch.save would: `torch.load(PATH, weights_only=True)` gives them back."""
    data, storages = state_dict_pickle(tensors)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        _aligned(archive, f"{TOP}/data.pkl", data)
        _aligned(archive, f"{TOP}/byteorder", b"little")
        for key, array in storages.items():
            _aligned(archive, f"{TOP}/data/{key}", array.tobytes())
        _aligned(archive, f"{TOP}/version", FORMAT_VERSION)
    return Path(path)
