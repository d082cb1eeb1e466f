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
Builtin values alone can still make unpickling hang or crash (a shared value hashed 2^60 times,
a million nested tuples, colliding int keys, a memo index of 2^32), so one pass over the opcodes
first, running nothing, refuses what no state dict is (_check_shape).
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import re
import reprlib
import zipfile
from _compat_pickle import IMPORT_MAPPING  # Python 2 module names → Python 3's
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

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
# data.pkl of a state dict is ~100 bytes a tensor (MOSS-TTS-Nano's: 60 KB); 16 MiB holds 150k
# tensors and bounds what a hostile one costs to refuse (the scan: at most ~12 s, ~0.4 GB)
MAX_PICKLE_BYTES = 16 << 20
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


# The stand-ins are named tuples: BUILD sets state through an object's __dict__ or setattr, and
# a named tuple has neither, so a pickle cannot rewrite one after it is checked (a frozen
# dataclass's __dict__ it can, and `torch.FloatStorage` is one object for every file read).


class _StorageType(NamedTuple):
    """What `torch.XStorage` unpickles to here: only its element type."""

    dtype: np.dtype


class _Storage(NamedTuple):
    key: str
    dtype: np.dtype
    numel: int


class _TensorView(NamedTuple):
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


def _empty_ordered_dict(*args, **kwargs) -> OrderedDict:
    # torch makes each OrderedDict empty and fills it by SETITEMS, whose keys the scan checks;
    # OrderedDict(pairs) would hash keys it never saw as keys
    if args or kwargs:
        raise TypeError("an OrderedDict is made with contents")
    return OrderedDict()


_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _empty_ordered_dict,
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
    _check_shape(data, path)
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


# ------------------------------------------------ the pickle's shape, read before it is unpickled

# Unpickling builds values out of shared parts (a memo GET is a reference, not a copy): a few
# hundred bytes make 60 nested pairs of one tuple, which hashing it as a dict key, comparing or
# printing it visits part by part, 2^61 times. A state dict of 100k tensors is a few million
# parts (~25 a tensor: its name, the rebuild call, its argument tuples and their numbers), so 50
# million leaves room for any real one and refuses what would take minutes or forever.
MAX_PARTS = 50_000_000
# hashing, comparing and printing recurse in C once a level, and a million levels (a 1 MB
# pickle) crash the interpreter; a state dict nests 6 deep (dict, rebuild call, its arguments,
# the storage, its persistent id tuple, the numbers in it), its _metadata 3
MAX_DEPTH = 64
# the values the unpickler holds at once: a state dict makes ~10 a tensor (tuples, rebuilt
# tensors) and stacks at most a batch of 1,000 items (Python's pickler's), while a pickle of
# nothing but empty lists filled into one another makes one per byte, ~60 bytes each in memory
MAX_VALUES = 4_000_000
MAX_STACK = 1_000_000
_OTHER, _NAME, _GLOBAL = 0, 1, 2  # what the scan keeps of an item's type


def _codes(*names: str) -> frozenset[str]:
    """The opcodes named NAMES, as genops gives them (OpcodeInfo.code)."""
    return frozenset(op.code for op in pickletools.opcodes if op.name in names)


def _effect(op: pickletools.OpcodeInfo) -> tuple[int, bool, int]:
    """What OP does to the stack, from pickletools' notes of it: the items it pops (under its
    MARK when it pops back to one, with all above it), whether it does, the items it pushes."""
    before = op.stack_before
    if pickletools.markobject in before:
        return before.index(pickletools.markobject), True, len(op.stack_after)
    return len(before), False, len(op.stack_after)


_EFFECT = {op.code: _effect(op) for op in pickletools.opcodes}
_MARK, _POP, _DUP = _codes("MARK"), _codes("POP"), _codes("DUP")
_PUT, _MEMOIZE = _codes("PUT", "BINPUT", "LONG_BINPUT"), _codes("MEMOIZE")
_GET, _BUILD = _codes("GET", "BINGET", "LONG_BINGET"), _codes("BUILD")
# these change the item under what they pop (a list, dict, set, or BUILD's object) in place
_MODIFIES = _codes("APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD")
# the kind each pushes: strings (hashed with a per-process seed, unlike numbers) and globals
_STRINGS = _codes("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING",
                  "BINSTRING", "SHORT_BINSTRING")  # fmt: skip
_KIND = {
    **dict.fromkeys(_STRINGS, _NAME),
    **dict.fromkeys(_codes("GLOBAL", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4"), _GLOBAL),
}
# ops that push a value of their own with nothing popped: what may be changed later
_FRESH = _codes("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "BYTEARRAY8")
# ops that pop nothing and push a value that never changes → the node of every such value of
# their kind (numbered as the kind; a string, number, None or global is one part, one deep)
_LEAF = {op.code: _KIND.get(op.code, _OTHER) for op in pickletools.opcodes
         if _EFFECT[op.code] == (0, False, 1) and op.code not in _MARK | _GET | _FRESH}  # fmt: skip
# ops that hash what they pop, → every how many of those is hashed: dicts their keys, sets all
_HASHES = {**dict.fromkeys(_codes("SETITEM", "SETITEMS", "DICT"), 2),
           **dict.fromkeys(_codes("ADDITEMS", "FROZENSET"), 1)}  # fmt: skip


class _Shape(Exception):
    """A pickle whose values no state dict of tensors has: what they are."""


class _Stack:
    """The unpickler's stack and memo as the scan sees them. Each value is a node: how many parts
    it has (each use of a shared part counted), how deep it nests, its kind. The stack and memo
    hold node numbers, so a list or dict filled after it is memoized (as Python's pickler writes
    every one) is seen grown wherever it is used. A container filled after another took it is
    counted in that other as it was then: harmless, as only hashing and comparing walk a value
    (a message quotes one by shown()), and what hashes (strings, numbers, tuples and frozensets
    of them) is whole when made. Arrays of numbers, a few bytes a value, as the unpickler's own
    stack holds a pointer a value."""

    def __init__(self) -> None:
        self.parts, self.depth, self.kind = array("q"), array("B"), array("B")
        self.stack, self.memo = array("q"), array("q")
        self.marks = array("q")  # where on the stack the items of each open MARK start
        for kind in (_OTHER, _NAME, _GLOBAL):  # node number KIND: every leaf of that kind
            self.node(1, 1, kind)

    def step(self, code: str, arg: Any) -> None:
        stack, leaf = self.stack, _LEAF.get(code)
        if leaf is not None:  # most of a state dict's ops: names, numbers, globals
            stack.append(leaf)
        elif code in _PUT or code in _MEMOIZE:
            self.store(arg if code in _PUT else len(self.memo), self.top())
        elif code in _GET:
            if not (isinstance(arg, int) and 0 <= arg < len(self.memo)):
                raise ValueError(f"memo entry {shown(arg)} is read before it is stored")
            stack.append(self.memo[arg])
        elif code in _MARK:
            self.marks.append(len(stack))
        elif code in _POP:
            if self.marks and self.marks[-1] == len(stack):
                self.marks.pop()  # POP with nothing above a MARK pops the MARK (protocol 0 does)
            else:
                self.top()
                stack.pop()
        elif code in _FRESH:
            stack.append(self.node(1, 1, _OTHER))
        elif code in _DUP:
            stack.append(self.top())
        else:
            self.apply(code)
        if len(stack) > MAX_STACK:
            raise _Shape(f"holds more than {MAX_STACK} values on its stack at once")

    def top(self) -> int:
        if len(self.stack) <= self.fence():
            raise ValueError("unpickling stack underflow")
        return self.stack[-1]

    def fence(self) -> int:
        """The lowest item an op may pop: the unpickler never pops through a MARK."""
        return self.marks[-1] if self.marks else 0

    def store(self, at: Any, node: int) -> None:
        if not isinstance(at, int) or at < 0:
            raise ValueError(f"memo index {shown(at)} is not a count")
        if at > len(self.memo):  # Python's pickler numbers its memo entries in order
            raise _Shape(f"stores memo entry {shown(at)} when it has made {len(self.memo)} (the "
                         "unpickler allocates 8 bytes for each number up to twice it)")  # fmt: skip
        if at == len(self.memo):
            self.memo.append(node)
        else:
            self.memo[at] = node

    def apply(self, code: str) -> None:
        """CODE's pops and push: what it makes has the parts of all it pops, plus one, and
        nests one deeper than the deepest; what it changes gains the parts of the rest."""
        popped, to_mark, pushes = _EFFECT[code]
        if to_mark:
            if not self.marks:
                raise ValueError("an op pops back to a MARK that is not there")
            start = self.marks.pop() - popped
        else:
            start = len(self.stack) - popped
        if start < self.fence():
            raise ValueError("unpickling stack underflow")
        if code in _HASHES:
            hashed = self.stack[start + (code in _MODIFIES) :: _HASHES[code]]  # past a dict
            if any(self.kind[node] != _NAME for node in hashed):  # an int hashes alike anywhere
                raise _Shape("keys a dict or set by something other than a string")
        if code in _MODIFIES:
            self.change(code, self.stack[start], start + 1)
        else:
            parts, depth = self.take(start)
            if pushes:
                self.stack.append(self.node(parts + 1, depth + 1, _KIND.get(code, _OTHER)))

    def change(self, code: str, node: int, start: int) -> None:
        """CODE puts the items from START up into NODE, which stays on the stack."""
        if code in _BUILD and self.kind[node] == _GLOBAL:  # our stand-in: one for every file
            raise _Shape("sets state on a global it names")
        if node <= _GLOBAL:  # the node of every string, number or None: the unpickler fails too
            raise ValueError("an op changes a value that has no contents")
        more, deeper = self.take(start)
        self.parts[node] += more
        self.depth[node] = max(self.depth[node], deeper + 1)
        self.check(node)

    def take(self, start: int) -> tuple[int, int]:
        """Pop the items from START up: the sum of their parts and the deepest's depth."""
        nodes = self.stack[start:]
        del self.stack[start:]
        parts, depth = self.parts, self.depth
        return sum(parts[n] for n in nodes), max((depth[n] for n in nodes), default=0)

    def node(self, parts: int, depth: int, kind: int) -> int:
        if len(self.kind) > MAX_VALUES:
            raise _Shape(f"makes more than {MAX_VALUES} values")
        self.parts.append(parts)
        self.depth.append(depth)
        self.kind.append(kind)
        self.check(len(self.kind) - 1)
        return len(self.kind) - 1

    def check(self, node: int) -> None:
        if self.parts[node] > MAX_PARTS:
            raise _Shape(f"builds a value of more than {MAX_PARTS} parts (a shared part "
                         "counted at each use)")  # fmt: skip
        if self.depth[node] > MAX_DEPTH:
            raise _Shape(f"nests values more than {MAX_DEPTH} deep")


def _check_shape(data: bytes, path: Path) -> None:
    """Refuse, before anything of it is unpickled, a pickle that would build a value too big or
    too deep to hash, compare or print, key a dict by anything but strings, set state on a
    global, or allocate a memo far beyond its size: one pass over its opcodes (pickletools reads
    them, running nothing) as a stack machine that keeps a few numbers an item."""
    step = _Stack().step
    try:
        for op, arg, _pos in pickletools.genops(data):
            step(op.code, arg)
    except _Shape as exc:
        raise InputError(f"its pickle {exc}, which a state dict of tensors never does; refused "
                         "before unpickling it", path=path,
                         hint=_REFUSED_HINT) from None  # fmt: skip
    except ValueError as exc:  # genops' own too: an unknown opcode, a truncated argument
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
