"""source/torch_pickle.py: torch's own `torch.save` files read without torch, tied storage kept;
pickles that name any other global refused in one line, their code never run."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from moss_gguf_cli.errors import InputError
from moss_gguf_cli.source.torch_pickle import read_state_dict

DTYPES = {torch.float32: np.float32, torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16}


class Tied(torch.nn.Module):
    """Nano's shape in small: an embedding and a head sharing one weight, a 2-D linear."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(12, 8)
        self.head = torch.nn.Linear(8, 12, bias=False)
        self.head.weight = self.wte.weight  # as upstream ties text_lm_head to wte
        self.fc = torch.nn.Linear(8, 6)


def saved_state(
    tmp_path: Path, dtype: torch.dtype, name: str = "pytorch_model.bin", protocol: int = 2
) -> tuple:
    torch.manual_seed(0)
    model = Tied().to(dtype)
    state = model.state_dict()
    base = torch.randn(5, 7).to(dtype)
    state["transposed"] = base.t()  # a non-contiguous view
    state["strided"] = base[1:, 1::3]  # an offset and a step into the same storage
    state["base"] = base
    state["scalar"] = torch.tensor(3.5, dtype=dtype)
    state["empty"] = torch.zeros(0, 4, dtype=dtype)
    state["steps"] = torch.arange(6, dtype=torch.int64)
    state["param"] = torch.nn.Parameter(torch.randn(3).to(dtype))  # _rebuild_parameter
    path = tmp_path / name
    torch.save(state, path, pickle_protocol=protocol)
    return path, state


@pytest.mark.parametrize("dtype", list(DTYPES), ids=lambda d: str(d).split(".")[1])
def test_what_torch_saves_reads_back_equal_with_storage_shared(tmp_path, dtype):
    path, state = saved_state(tmp_path, dtype)
    got = read_state_dict(path)
    assert list(got.tensors) == list(state)
    for name, tensor in state.items():
        ours = got.tensors[name]
        want = DTYPES.get(tensor.dtype, np.int64)
        assert ours.dtype == np.dtype(want) and ours.shape == tuple(tensor.shape), name
        tensor = tensor.detach()
        theirs = tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
        np.testing.assert_array_equal(ours.astype(theirs.dtype), theirs, err_msg=name)
        assert not ours.flags.writeable
    # one storage, several views: as torch wrote them, not copies
    assert np.shares_memory(got.tensors["wte.weight"], got.tensors["head.weight"])
    assert np.shares_memory(got.tensors["base"], got.tensors["transposed"])
    assert np.shares_memory(got.tensors["base"], got.tensors["strided"])
    assert not np.shares_memory(got.tensors["wte.weight"], got.tensors["fc.weight"])
    groups = sorted(sorted(names) for names in got.tied().values())
    assert groups == [["base", "strided", "transposed"], ["head.weight", "wte.weight"]]


def test_the_zip_top_folder_may_have_any_name(tmp_path):
    path, state = saved_state(tmp_path, torch.bfloat16, name="weights_v2.pt")
    renamed = path.rename(tmp_path / "pytorch_model.bin")
    with zipfile.ZipFile(renamed) as archive:
        assert {n.split("/")[0] for n in archive.namelist()} >= {"weights_v2"}
    got = read_state_dict(renamed)
    want = state["fc.weight"].float().numpy()
    np.testing.assert_array_equal(got.tensors["fc.weight"].astype(np.float32), want)
    buffer = io.BytesIO()  # what a file object gets: torch calls the folder "archive"
    torch.save({"w": state["fc.weight"]}, buffer)
    (tmp_path / "from_buffer.bin").write_bytes(buffer.getvalue())
    got = read_state_dict(tmp_path / "from_buffer.bin")
    np.testing.assert_array_equal(got.tensors["w"].astype(np.float32), want)


class RunsAShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Evaluates:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.mark.parametrize(
    ("payload", "named"),
    [(RunsAShell, f"{os.system.__module__}.system"), (Evaluates, "builtins.eval")],
    ids=["os.system", "builtins.eval"],
)
def test_a_pickle_naming_another_global_is_refused_and_never_runs(tmp_path, payload, named):
    marker = tmp_path / "it-ran"
    state = {"w": torch.ones(2, 2), "x": payload(marker)}
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)  # torch's own writer pickles the payload's __reduce__
    with pytest.raises(InputError) as caught:
        read_state_dict(path)
    line = caught.value.one_line()
    assert f"names {named}," in line and str(path) in line and "\n" not in line
    assert not marker.exists()
    # the control: torch's full unpickler does run it, so the marker above could have appeared
    torch.load(path, weights_only=False)
    assert marker.exists()


def replaced(path: Path, entry_end: str, data: bytes) -> None:
    """Rewrite PATH's zip with the entry ending in ENTRY_END holding DATA (CRCs recomputed)."""
    with zipfile.ZipFile(path) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    with zipfile.ZipFile(path, "w") as new:
        for info, raw in entries:
            new.writestr(info, data if info.filename.endswith(entry_end) else raw)


@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
def test_every_pickle_protocol_is_refused_alike(tmp_path, protocol):
    """GLOBAL (protocol 2) and STACK_GLOBAL (4, 5) reach a callable the same way."""
    marker = tmp_path / "it-ran"
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(1)}, path)
    replaced(path, "/data.pkl", pickle.dumps({"x": RunsAShell(marker)}, protocol=protocol))
    with pytest.raises(InputError, match=r"names (posix|os|nt)\.system,"):
        read_state_dict(path)
    assert not marker.exists()


def test_a_storage_shorter_than_its_tensors_is_refused(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(4, 4)}, path)
    replaced(path, "/data/0", b"\0" * 12)
    with pytest.raises(InputError, match="storage .*/data/0 holds 12 bytes, not 16 × 4"):
        read_state_dict(path)


def test_what_is_not_a_torch_zip_or_not_a_state_dict_is_refused(tmp_path):
    legacy = tmp_path / "legacy.bin"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(InputError, match="not a torch zip checkpoint"):
        read_state_dict(legacy)
    listed = tmp_path / "list.bin"
    torch.save([torch.ones(2)], listed)
    with pytest.raises(InputError, match="holds a list, not a state dict"):
        read_state_dict(listed)
    storage = tmp_path / "storage.bin"  # torch writes torch.storage.UntypedStorage for it
    torch.save({"w": torch.ones(2), "raw": torch.ones(4).untyped_storage()}, storage)
    with pytest.raises(InputError, match="entry 'raw' is not a tensor"):
        read_state_dict(storage)
    number = tmp_path / "number.bin"
    torch.save({"w": torch.ones(2), "step": 7}, number)
    with pytest.raises(InputError, match="entry 'step' is not a tensor"):
        read_state_dict(number)


# ------------------------------------------------- a checkpoint is untrusted input: bounded reads


def test_a_compressed_entry_is_refused_before_it_is_inflated(tmp_path):
    """torch.save stores its entries; a compressed one could inflate from a few bytes to any
    size before its size is known (a 785-byte bzip2 entry made 2.2 GB), so none is read."""
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(1 << 16)}, path)
    with zipfile.ZipFile(path) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    with zipfile.ZipFile(path, "w") as new:  # zipfile's own writer, the storage as bzip2
        for info, raw in entries:
            info.compress_type = (zipfile.ZIP_BZIP2 if info.filename.endswith("/data/0")
                                  else zipfile.ZIP_STORED)  # fmt: skip
            new.writestr(info, raw)
    with zipfile.ZipFile(path) as check:
        bz = next(i for i in check.infolist() if i.filename.endswith("/data/0"))
        assert bz.compress_size < 200 < bz.file_size  # 256 KiB of zeros in a few bytes
    with pytest.raises(InputError, match=r"data/0 is compressed; torch.save stores"):
        read_state_dict(path)


def test_a_view_needing_more_elements_than_its_storage_is_refused_by_name(tmp_path):
    """A zero stride makes one stored float a million (a 13 KB file became a 787 MB folder)."""
    path = tmp_path / "pytorch_model.bin"
    torch.save({"ok": torch.ones(3), "spread": torch.ones(1).expand(1_000_000)}, path)
    with pytest.raises(InputError) as caught:
        read_state_dict(path)
    line = caught.value.one_line()
    assert "tensor 'spread'" in line and "needs 1000000 elements" in line and "holds 1" in line


class _Marker:
    """Pickled as a persistent id of the pickler's choosing."""


def test_a_deep_shared_value_is_refused_in_a_few_characters(tmp_path, monkeypatch):
    """60 nested pairs of one list pickle in a few hundred bytes; str() of them would be 2^60
    characters long. The scan refuses them before unpickling, in a bounded line, at once."""
    deep: list = []
    for _ in range(60):
        deep = [deep, deep]

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", deep) if isinstance(obj, _Marker) else None

    data = io.BytesIO()
    Pickler(data, protocol=2).dump({"w": _Marker()})
    assert len(data.getvalue()) < 1000
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(1)}, path)
    replaced(path, "/data.pkl", data.getvalue())
    monkeypatch.setattr(f"{UNPICKLER}.load", never_unpickled)
    with pytest.raises(InputError, match="more than 50000000 parts") as caught:
        read_state_dict(path)
    assert len(caught.value.one_line()) < 400


# ------------------------------------ builtin values alone: refused by the scan before unpickling

UNPICKLER = "moss_gguf_cli.source.torch_pickle._StateDictUnpickler"


def never_unpickled(self):
    # stands in for the unpickler where the scan must refuse first: a probe that got past it
    # fails here instead of hanging or crashing the test process
    raise AssertionError("the pickle reached the unpickler")


def holding(tmp_path: Path, data: bytes) -> Path:
    """A torch.save file whose data.pkl is DATA."""
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(1)}, path)
    replaced(path, "/data.pkl", data)
    return path


def body(value) -> bytes:
    """VALUE's pickle opcodes as Python's pickler writes them, without PROTO and STOP."""
    data = pickle.dumps(value, protocol=2)
    assert data[:2] == pickle.PROTO + b"\x02" and data[-1:] == pickle.STOP
    return data[2:-1]


def keyed(key: bytes) -> bytes:
    """The pickle of {KEY: 1}, KEY given as opcodes: a dict Python could not build to dump."""
    return pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + key + pickle.BININT1 + b"\x01" + \
        pickle.SETITEM + pickle.STOP  # fmt: skip


def shared_pairs(levels: int) -> tuple:
    """LEVELS nested pairs of one tuple: 2^LEVELS paths to its innermost ()."""
    shared: tuple = ()
    for _ in range(levels):
        shared = (shared, shared)
    return shared


def nested_lists(levels: int) -> bytes:
    """LEVELS lists each holding the next: MARK ... EMPTY_LIST LIST ... (too deep for dumps)."""
    return pickle.MARK * levels + pickle.EMPTY_LIST + pickle.LIST * levels


def nested_tuples(levels: int) -> bytes:
    """LEVELS 1-tuples each holding the next."""
    return pickle.EMPTY_TUPLE + pickle.TUPLE1 * levels


COLLIDING = (1 << 61) - 1  # hash(n * COLLIDING) == 0 for every int n, in every process


@pytest.mark.parametrize(
    ("data", "refusal"),
    [
        # hashing the key visits 2^61 parts: the unpickler would never return
        (keyed(body(shared_pairs(60))), "builds a value of more than 50000000 parts"),
        (pickle.dumps({"w": [shared_pairs(60)]}, protocol=4), "more than 50000000 parts"),
        # hashing a million nested tuples overflows the C stack: the interpreter segfaults
        (keyed(nested_tuples(1_000_000)), "nests values more than 64 deep"),
        (pickle.PROTO + b"\x02" + nested_lists(100_000) + pickle.STOP, "more than 64 deep"),
        # every key hashes to 0: inserting n of them compares n^2 / 2 pairs
        (pickle.dumps(dict.fromkeys(n * COLLIDING for n in range(1, 1000)), protocol=2),
         "keys a dict or set by something other than a string"),
        (pickle.dumps({"w": frozenset(range(3))}, protocol=4), "something other than a string"),
        # the C unpickler makes its memo an array as long as twice the largest index: 64 GiB
        (pickle.PROTO + b"\x02" + pickle.NONE + pickle.LONG_BINPUT + struct.pack("<I", 2**32 - 1)
         + pickle.STOP, "stores memo entry 4294967295 when it has made 0"),
    ],
    ids=["shared-tuple-key", "shared-tuple", "deep-tuple-key", "deep-lists", "int-keys",
         "frozenset", "memo-index"],
)  # fmt: skip
def test_a_pickle_too_costly_to_unpickle_is_refused_before_it_is(tmp_path, monkeypatch, data,
                                                                 refusal):  # fmt: skip
    path = holding(tmp_path, data)
    monkeypatch.setattr(f"{UNPICKLER}.load", never_unpickled)
    with pytest.raises(InputError) as caught:
        read_state_dict(path)
    line = caught.value.one_line()
    assert refusal in line and "refused before unpickling it" in line, line
    assert line.startswith(f"{path}: its pickle ") and "\n" not in line and len(line) < 400


def test_state_set_on_a_named_global_is_refused_and_later_files_read_alike(tmp_path):
    """BUILD on `torch.FloatStorage` would rewrite the one stand-in every file read uses (its
    dtype int32: the next file's floats read as integers)."""
    dtype = pickle.BININT1 + b"\x00"  # any state: refused before it is looked at
    data = pickle.PROTO + b"\x02" + pickle.GLOBAL + b"torch\nFloatStorage\n" + \
        pickle.EMPTY_DICT + pickle.SHORT_BINUNICODE + b"\x05dtype" + dtype + pickle.SETITEM + \
        pickle.BUILD + pickle.STOP  # fmt: skip
    with pytest.raises(InputError, match="its pickle sets state on a global it names"):
        read_state_dict(holding(tmp_path, data))
    path = tmp_path / "next.bin"
    torch.save({"w": torch.full((2,), 1.5)}, path)
    got = read_state_dict(path).tensors["w"]
    assert got.dtype == np.float32 and got.tolist() == [1.5, 1.5]


def test_an_ordered_dict_made_with_contents_is_refused(tmp_path):
    """OrderedDict(pairs) hashes keys the scan never saw as keys; torch makes each empty."""
    pairs = pickle.dumps([(n * COLLIDING, None) for n in range(1, 4)], protocol=2)[2:-1]
    data = pickle.PROTO + b"\x02" + pickle.GLOBAL + b"collections\nOrderedDict\n" + \
        pickle.MARK + pairs + pickle.TUPLE + pickle.REDUCE + pickle.STOP  # fmt: skip
    assert pickle.loads(data) == OrderedDict((n * COLLIDING, None) for n in range(1, 4))
    with pytest.raises(InputError, match=r"malformed \(an OrderedDict is made with contents\)"):
        read_state_dict(holding(tmp_path, data))


@pytest.mark.parametrize("protocol", [1, 2, 4, 5])
def test_what_torch_saves_at_any_protocol_passes_the_scan(tmp_path, protocol):
    """Protocol 4 and 5 add FRAME, MEMOIZE and STACK_GLOBAL; 1 writes no PROTO."""
    path, state = saved_state(tmp_path, torch.float32, protocol=protocol)
    got = read_state_dict(path)
    assert list(got.tensors) == list(state)
    for name, tensor in state.items():
        np.testing.assert_array_equal(got.tensors[name], tensor.detach().numpy(), err_msg=name)
