"""A torch `pytorch_model.bin` read without torch and without running any of its pickle code.

`torch.save` writes a zip: `TOP/data.pkl` (a pickle of the state dict), `TOP/data/KEY` (the raw
bytes of each storage), `TOP/byteorder`, `TOP/version` (TOP is the file's stem when it was
saved, so it varies). The pickle refers to storages by key through persistent ids
(`('storage', StorageClass, key, location, numel)`) and rebuilds each tensor with
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`, so several tensors can
be views of one storage (tied weights).

Unpickling runs whatever callable a pickle names, so this module's unpickler admits exactly the
globals a state dict of plain tensors uses, each mapped to our own stand-in (nothing of torch is
imported or called), and refuses any other global in one line naming it before it is called.
"""

from __future__ import annotations

import io
import math
import pickle
import re
import reprlib
import zipfile
from _compat_pickle import IMPORT_MAPPING  # Python 2 module names → Python 3's
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..bf16 import bfloat16
from ..errors import InputError

# the legacy dtype-typed storage classes torch pickles for a tensor's storage (`torch.XStorage`)
STORAGE_DTYPES: dict[str, np.dtype] = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": bfloat16(),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}
# an untyped storage (bytes) is pickled as its class; its numel counts bytes
UNTYPED = (("torch", "UntypedStorage"), ("torch.storage", "UntypedStorage"))
_KEY = re.compile(r"[0-9A-Za-z_]{1,64}")  # a storage key names a zip entry: nothing else
# data.pkl of a state dict is a few bytes a tensor: a model of 100k tensors needs ~10 MB
MAX_PICKLE_BYTES = 256 << 20
# how a value read from the pickle is shown in a message: a few levels and characters, however
# deep or shared it is (str() of 60 nested pairs of one tuple would be 2^60 characters long)
_SHOWN = reprlib.Repr()  # keywords only from Python 3.12
_SHOWN.maxlevel, _SHOWN.maxtuple, _SHOWN.maxlist, _SHOWN.maxdict = 2, 4, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 60


def shown(value: Any) -> str:
    """VALUE as a message may quote it: bounded, whatever it is."""
    return _SHOWN.repr(value)[:80]
_HINT = "the file is truncated or corrupt; download it again"
_REFUSED_HINT = "only a plain state dict of tensors is read; use the model's safetensors if any"


@dataclass(frozen=True)
class _StorageType:
    """What `torch.XStorage` unpickles to here: only its element type."""

    dtype: np.dtype


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: np.dtype
    numel: int


@dataclass(frozen=True)
class _TensorView:
    """What `_rebuild_tensor_v2` unpickles to here: where a tensor's elements are."""

    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage, offset, size, stride, *_rest) -> _TensorView:
    # requires_grad, backward hooks and metadata do not change the values
    if not isinstance(storage, _Storage):
        raise TypeError("a tensor is rebuilt over something that is not a storage")
    return _TensorView(storage, int(offset), tuple(map(int, size)), tuple(map(int, stride)))


def _rebuild_parameter(data, *_rest) -> _TensorView:
    if not isinstance(data, _TensorView):
        raise TypeError("a parameter is rebuilt over something that is not a tensor")
    return data


_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()},
    **{where: _StorageType(np.dtype("u1")) for where in UNTYPED},
}


class _Refused(Exception):
    """A global outside the admitted set: raised before anything of it is looked up."""


class _StateDictUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # every way a pickle reaches a callable (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*) asks here
        found = _GLOBALS.get((module, name))
        if found is None:  # named as Python would import it (protocol 2 says __builtin__)
            raise _Refused(f"{IMPORT_MAPPING.get(module, module)[:80]}.{name[:80]}")
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise TypeError(f"unknown persistent id {shown(pid)}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(numel, int) or numel < 0:
            raise TypeError("a storage record of the wrong form")
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise TypeError(f"storage key {shown(key)} is not a plain name")
        return _Storage(key, kind.dtype, numel)


@dataclass
class TorchStateDict:
    """The tensors of a `torch.save`d state dict, as read-only NumPy arrays (bf16 as
    ml_dtypes.bfloat16). Tensors that were views of one storage are views of one array here."""

    path: Path
    tensors: dict[str, np.ndarray]
    storage_of: dict[str, str]  # tensor name → the key of the storage it views

    def tied(self) -> dict[str, list[str]]:
        """Storage key → the names viewing it, for storages more than one tensor views."""
        groups: dict[str, list[str]] = {}
        for name, key in self.storage_of.items():
            groups.setdefault(key, []).append(name)
        return {key: names for key, names in groups.items() if len(names) > 1}


def top_folder(names: list[str], path: Path) -> str:
    """The zip's one top folder holding data.pkl (torch names it after the file it saved)."""
    tops = [n[: -len("/data.pkl")] for n in names if n.endswith("/data.pkl")]
    tops = [t for t in tops if t and "/" not in t]
    if len(tops) != 1:
        raise InputError(
            f"holds {len(tops)} top-level data.pkl entries, not one", path=path, hint=_HINT
        )
    return tops[0]


def read_state_dict(path: Path) -> TorchStateDict:
    """Every tensor of the torch checkpoint PATH; refuses, in one line, any pickle that names a
    global outside collections.OrderedDict, torch._utils._rebuild_tensor_v2/_rebuild_parameter
    and torch's storage classes, before that global is called."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise InputError(
            "is not a torch zip checkpoint (torch >= 1.6 writes one; older pickles are not read)",
            path=path,
            hint=_HINT,
        )
    try:
        with zipfile.ZipFile(path) as archive:
            return _read(archive, path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputError(f"cannot be read as a zip ({exc})", path=path, hint=_HINT) from exc


def _read(archive: zipfile.ZipFile, path: Path) -> TorchStateDict:
    names = archive.namelist()
    top = top_folder(names, path)
    if f"{top}/byteorder" in names and archive.read(f"{top}/byteorder").strip() != b"little":
        raise InputError("was saved on a big-endian machine; only little-endian is read", path=path)
    state = _unpickle(_entry(archive, f"{top}/data.pkl", path, most=MAX_PICKLE_BYTES), path)
    if not isinstance(state, dict):
        raise InputError(
            f"holds a {type(state).__name__}, not a state dict", path=path, hint=_REFUSED_HINT
        )
    storages: dict[str, np.ndarray] = {}
    tensors: dict[str, np.ndarray] = {}
    storage_of: dict[str, str] = {}
    for name, view in state.items():
        if not isinstance(name, str) or not isinstance(view, _TensorView):
            raise InputError(f"entry {shown(name)} is not a tensor", path=path, hint=_REFUSED_HINT)
        key = view.storage.key
        if key not in storages:
            storages[key] = _storage_array(archive, f"{top}/data/{key}", view.storage, path)
        elif storages[key].dtype != view.storage.dtype:
            raise InputError(f"storage {key} is read as two dtypes", path=path, hint=_HINT)
        tensors[name] = _view(storages[key], view, name, path)
        storage_of[name] = key
    return TorchStateDict(path, tensors, storage_of)


def _unpickle(data: bytes, path: Path) -> Any:
    try:
        return _StateDictUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise InputError(
            f"its pickle names {exc}, which a state dict of tensors never does; refused "
            "without running it",
            path=path,
            hint=_REFUSED_HINT,
        ) from None
    except (
        pickle.UnpicklingError,
        TypeError,
        ValueError,
        AttributeError,
        EOFError,
        IndexError,
        KeyError,
    ) as exc:
        raise InputError(f"its pickle is malformed ({str(exc)[:200]})", path=path,
                         hint=_HINT) from None  # fmt: skip


def _entry(archive: zipfile.ZipFile, entry: str, path: Path, *, most: int) -> bytes:
    """ENTRY's bytes, read only when its declared size is at most MOST and it is stored as
    torch.save stores every entry, uncompressed: a compressed entry could inflate to any size
    from a few bytes before its size is known. zipfile checks the CRC."""
    try:
        info = archive.getinfo(entry)
    except KeyError:
        raise InputError(f"{entry} is missing", path=path, hint=_HINT) from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise InputError(f"{entry} is compressed; torch.save stores its entries as they are",
                         path=path, hint=_HINT)  # fmt: skip
    if info.file_size > most:
        raise InputError(f"{entry} declares {info.file_size} bytes, more than the {most} its "
                         "tensors need", path=path, hint=_HINT)  # fmt: skip
    with archive.open(info) as f:
        raw = f.read(most + 1)
    if len(raw) != info.file_size:
        raise InputError(f"{entry} holds {len(raw)} bytes, not the {info.file_size} it "
                         "declares", path=path, hint=_HINT)  # fmt: skip
    return raw


def _storage_array(archive: zipfile.ZipFile, entry: str, storage: _Storage, path: Path):
    size = storage.numel * storage.dtype.itemsize
    if entry not in archive.NameToInfo:
        raise InputError(f"storage {entry} is missing", path=path, hint=_HINT)
    declared = archive.getinfo(entry).file_size
    if declared != size:
        raise InputError(
            f"storage {entry} holds {declared} bytes, not {storage.numel} × "
            f"{storage.dtype.itemsize}",
            path=path,
            hint=_HINT,
        )
    return np.frombuffer(_entry(archive, entry, path, most=size), dtype=storage.dtype)


def _view(storage: np.ndarray, view: _TensorView, name: str, path: Path) -> np.ndarray:
    """The tensor NAME as torch saw it: SHAPE elements at OFFSET + Σ index·stride of STORAGE."""
    shape, stride, offset = view.shape, view.stride, view.offset
    bad = len(shape) != len(stride) or offset < 0 or min(shape + stride, default=0) < 0
    last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=False) if n > 0)
    empty = 0 in shape
    where = f"tensor {shown(name)} (shape {shown(list(shape))}, stride {shown(list(stride))}, " \
        f"offset {offset})"
    if bad or (not empty and last >= storage.size):
        raise InputError(f"{where} reaches outside its storage of {storage.size} elements",
                         path=path, hint=_HINT)  # fmt: skip
    numel = math.prod(shape)
    if numel > storage.size - offset:
        # zero or overlapping strides: a few bytes stored would become any number written
        raise InputError(f"{where} needs {numel} elements but its storage holds "
                         f"{storage.size - offset} from its offset", path=path,
                         hint=_HINT)  # fmt: skip
    if empty:
        none = np.zeros(shape, dtype=storage.dtype)
        none.flags.writeable = False  # as read-only as the views
        return none
    item = storage.dtype.itemsize
    return np.lib.stride_tricks.as_strided(
        storage[offset:], shape, tuple(s * item for s in stride), writeable=False
    )
