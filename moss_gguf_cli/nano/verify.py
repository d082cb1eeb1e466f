"""`verify` of a MOSS-TTS-Nano folder (nano/layout.py): its own rows.

Rows: the manifest's files (there, of the listed size and sha256); the folder's parts (each
GGUF the manifest lists, the 17 tables and the local transformer as float32 .npy of the
config's shapes, tokenizer.model, each synth config's paths); the codec (the ONNX release's
meta and graphs, nano/codec_folder.py); each GGUF's header against the config (starcoder2, its
keys, every tensor with its shape, the data all there); and the values against the source:
every array bit for bit, each GGUF tensor as nano/global_gguf.py would write it from the
source (the q/k permutation included: F32 exactly, a quantized type within its limit). The
source is --source, else what the manifest says the folder was made from where it is still
here (the builtin, the folder, the Hub snapshot in the cache); without one the values are a
warning row. `--deep` runs each GGUF in llama.cpp against the exact file (nano_deep.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..disk.confine import table_header
from ..errors import InputError, UsageError
from ..gguf.read import GgufFile, GgufFormatError, read_gguf
from ..report import Rows
from ..source.checkpoint import BUILTIN_PREFIX
from ..verify.folder_files import folder_json, synth_config_problems
from ..verify.manifest import format_manifest, manifest_problems
from ..verify.quality import tensor_threshold
from ..verify.result import GROUPS, VerifyReport
from ..verify.tensors import dequantize_rows
from .checkpoint import NanoCheckpoint, expected_shapes, open_nano, tokenizer_problem
from .codec_folder import open_nano_codec
from .config import NanoConfig
from .global_gguf import ARCH, global_array, plan_global_tensors
from .layout import FORMAT, array_files, array_of
from .tiny import ensure_tiny_nano
from .verify_deep import deep_rows

KIND = "nano"
YAML_PATHS = ("global_gguf", "tables_dir", "local_dir", "tokenizer", "audio_tokenizer_dir")


def nano_manifest(path: Path) -> dict | None:
    """The manifest of a Nano folder, None when PATH is not one."""
    return format_manifest(path, FORMAT)


def verify_nano(target: Path, source: str | None, deep: bool) -> VerifyReport:
    """The Nano rows for the folder TARGET; failing checks are rows."""
    started = time.perf_counter()
    folder = Path(target).expanduser()
    manifest = nano_manifest(folder) or {}
    rows = Rows()
    rows.group = "manifest"
    n = len(manifest.get("files") or [])
    rows.check("manifest files", manifest_problems(folder, manifest),
               f"{n} files, sizes and sha256 as listed")  # fmt: skip
    nano = NanoConfig.from_dict(folder_json(folder / "config.json"), folder / "config.json")
    ggufs = _file_rows(folder, manifest, nano, rows)
    rows.group = "gguf"
    for path in ggufs:
        _gguf_rows(path, nano, manifest["quant_types"][path.name], rows)
    rows.group = "source"
    checkpoint = _source(folder, manifest, source, rows)
    scans = {path: _scan(path, checkpoint) for path in ggufs}  # each GGUF dequantized once
    rows.group = "gguf"
    rows.check("finite weights", _nonfinite(folder, nano, scans),
               "every array and GGUF tensor holds finite values")  # fmt: skip
    rows.group = "source"
    if checkpoint is not None:
        _value_rows(folder, checkpoint, scans, rows)
    if deep:
        _deep(checkpoint, {g: manifest["quant_types"][g.name] for g in ggufs}, folder, rows)
    return VerifyReport(
        target=folder, kind=KIND, rows=sorted(rows.rows, key=lambda r: GROUPS.index(r.group)),
        model={"family": FORMAT, "n_vq": nano.n_vq, "hidden": nano.hidden,
               "layers": nano.dims.layers, "vocab": nano.dims.vocab},
        seconds=time.perf_counter() - started,
    )  # fmt: skip


def _deep(checkpoint: NanoCheckpoint | None, ggufs: dict[Path, str], folder: Path,
          rows: Rows) -> None:  # fmt: skip
    if checkpoint is None:
        raise UsageError(
            "--deep compares llama.cpp with the exact file written from the source, and the "
            "source is not here",
            path=folder,
            hint="pass --source with the checkpoint the folder was made from",
        )
    deep_rows(checkpoint, ggufs, rows)


def _file_rows(folder: Path, manifest: dict, nano: NanoConfig, rows: Rows) -> list[Path]:
    """The folder's parts; the GGUFs the manifest lists that are there."""
    rows.group = "files"
    names = sorted(manifest.get("quant_types") or {})
    missing = [n for n in names if not (folder / n).is_file()]
    rows.check("global GGUFs", missing + ([] if names else ["the manifest lists none"]),
               ", ".join(names))  # fmt: skip
    rows.check("arrays", _array_problems(folder, nano),
               f"{len(array_files(nano))} float32 .npy: 17 tables, the local transformer")
    tok = folder / "tokenizer.model"
    problem = tokenizer_problem(tok, nano.dims.vocab) if tok.is_file() else "is missing"
    rows.check("tokenizer", [f"tokenizer.model {problem}"] if problem else [],
               "tokenizer.model loads, encodes, every id inside the text table")  # fmt: skip
    rows.check("synth config", synth_config_problems(folder, YAML_PATHS),
               "every path names what exists")  # fmt: skip
    _codec_row(folder, rows)
    return [folder / n for n in names if n not in missing]


def _array_problems(folder: Path, nano: NanoConfig) -> list[str]:
    shapes = expected_shapes(nano)
    problems = []
    for rel, name in array_files(nano).items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
            continue
        try:
            shape, dtype = _npy_header(path)
        except InputError as exc:
            problems.append(f"{rel}: {exc.message}")
            continue
        if shape != shapes[name] or dtype != np.dtype("<f4"):
            problems.append(f"{rel} is {dtype} {list(shape)}, not float32 {list(shapes[name])}")
    return problems


def _nonfinite(folder: Path, nano: NanoConfig, scans: dict[Path, _Scan]) -> list[str]:
    """The arrays and GGUF tensors holding NaN or infinity: a folder of them passes every
    shape check and then speaks noise, or nothing."""
    bad = [rel for rel in array_files(nano) if (folder / rel).is_file() and not
           np.isfinite(np.load(folder / rel, mmap_mode="r", allow_pickle=False)).all()]  # fmt: skip
    bad += [f"{path.name}: {name}" for path, scan in scans.items() for name in scan.nonfinite]
    return [f"{b} holds NaN or infinite values" for b in bad[:3]] + (
        [f"and {len(bad) - 3} more"] if len(bad) > 3 else [])


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """A .npy's shape and dtype from its header (1-D arrays too: norms and biases)."""
    if np.load(path, mmap_mode="r", allow_pickle=False).ndim == 2:
        return table_header(path)
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    return tuple(array.shape), array.dtype


def _codec_row(folder: Path, rows: Rows) -> None:
    codec = folder / "audio_tokenizer"
    if not codec.is_dir():
        rows.add("audio tokenizer", "warn", "none: the folder cannot speak",
                 "moss-gguf all --audio-tokenizer OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano-ONNX")
        return
    try:
        opened = open_nano_codec(codec)
    except InputError as exc:
        rows.add("audio tokenizer", "fail", exc.message, exc.hint or "")
        return
    rows.add("audio tokenizer", "pass", f"{opened.sample_rate} Hz, {opened.channels} channels, "
             f"{opened.n_vq} codebooks; encode, decode_full, decode_step by name")  # fmt: skip


def _gguf_rows(path: Path, nano: NanoConfig, file_type: str, rows: Rows) -> None:
    try:
        g = read_gguf(path)
    except (GgufFormatError, OSError) as exc:
        rows.add(f"{path.name}: header", "fail", str(exc))
        return
    dims = nano.dims
    want = {"general.architecture": ARCH, f"{ARCH}.embedding_length": dims.hidden,
            f"{ARCH}.feed_forward_length": dims.inner, f"{ARCH}.block_count": dims.layers,
            f"{ARCH}.attention.head_count": dims.heads,
            f"{ARCH}.attention.head_count_kv": dims.heads,
            f"{ARCH}.rope.dimension_count": dims.head_dim, f"{ARCH}.vocab_size": dims.vocab,
            f"{ARCH}.context_length": dims.context, "tokenizer.ggml.model": "no_vocab"}  # fmt: skip
    problems = [f"{k} is {g.kv.get(k)!r}, the config says {v!r}" for k, v in want.items()
                if g.kv.get(k) != v]  # fmt: skip
    for key, value in ((f"{ARCH}.rope.freq_base", dims.rope_base),
                       (f"{ARCH}.attention.layer_norm_epsilon", dims.eps)):  # fmt: skip
        if not np.isclose(g.kv.get(key, np.nan), value, rtol=1e-6):
            problems.append(f"{key} is {g.kv.get(key)!r}, the config says {value!r}")
    problems += _tensor_problems(g, nano)
    rows.check(f"{path.name}: header", problems,
               f"{ARCH}, {dims.layers} layers, hidden {dims.hidden}, {file_type}; every tensor "
               "there with its shape")  # fmt: skip


def _tensor_problems(g: GgufFile, nano: NanoConfig) -> list[str]:
    shapes = expected_shapes(nano)
    plan = {t.name: tuple(reversed(shapes[t.source])) for t in
            plan_global_tensors(nano.dims.layers)}  # fmt: skip
    problems = [f"{n} is missing" for n in plan if n not in g.tensors]
    problems += [f"{n} is not in the plan" for n in g.tensors if n not in plan]
    problems += [f"{n} is {list(t.dims)}, expected {list(plan[n])}" for n, t in g.tensors.items()
                 if n in plan and t.dims != plan[n]]  # fmt: skip
    problems += [f"{n} runs past the file's end" for n, t in g.tensors.items() if not g.in_file(t)]
    return problems


def _source(folder: Path, manifest: dict, source: str | None, rows: Rows) -> NanoCheckpoint | None:
    """The source checkpoint opened: --source, else the manifest's made_from where it is here."""
    where = source or _made_from_source(manifest)
    if where is None:
        rows.add("values vs source", "warn", "not checked: the source is not here",
                 "pass --source with the checkpoint the folder was made from")  # fmt: skip
        return None
    if where.startswith(BUILTIN_PREFIX):
        return open_nano(ensure_tiny_nano(where[len(BUILTIN_PREFIX) :]))
    return open_nano(Path(where).expanduser())


def _made_from_source(manifest: dict) -> str | None:
    made = (manifest.get("made_from") or {}).get("source") or {}
    if "model" in made:
        return str(made["model"])
    if "folder" in made and Path(made["folder"]).is_dir():
        return str(made["folder"])
    return None


def _value_rows(folder: Path, checkpoint: NanoCheckpoint, scans: dict[Path, _Scan],
                rows: Rows) -> None:  # fmt: skip
    files = array_files(checkpoint.nano)
    differ = [rel for rel, name in files.items() if (folder / rel).is_file()
              and not np.array_equal(np.load(folder / rel, allow_pickle=False),
                                     array_of(checkpoint, name))]  # fmt: skip
    rows.check("arrays vs source", differ, f"{len(files)} arrays equal the source bit for bit")
    theirs = {"config.json": checkpoint.root / "config.json",
              "tokenizer.model": checkpoint.tokenizer}  # fmt: skip
    copied = [name for name, there in theirs.items() if (folder / name).is_file()
              and (there is None or not _same_bytes(folder / name, there))]  # fmt: skip
    rows.check("copies vs source", [f"{n} is not the source's" for n in copied],
               "config.json and tokenizer.model are the source's, byte for byte")
    for path, scan in scans.items():
        rows.check(f"{path.name}: values vs source", scan.problems,
                   f"every tensor as written from the source (q/k permuted per head); worst "
                   f"relative RMSE {scan.worst:.2e}")  # fmt: skip


def _same_bytes(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


@dataclass
class _Scan:
    """One read of a GGUF's tensors: those not finite and, against a source, what differs."""

    nonfinite: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    worst: float = 0.0  # the largest relative RMSE from the source


def _scan(path: Path, checkpoint: NanoCheckpoint | None) -> _Scan:
    """PATH's tensors dequantized once each: checked finite, and with CHECKPOINT each compared
    with the tensor nano/global_gguf.py would write from it (F32 exactly, a quantized type
    within its limit)."""
    scan = _Scan()
    try:
        g = read_gguf(path)
    except (GgufFormatError, OSError):
        return scan  # the header row names it
    plan = {} if checkpoint is None else {
        t.name: t for t in plan_global_tensors(checkpoint.nano.dims.layers)}  # fmt: skip
    fd = os.open(g.path, os.O_RDONLY)
    try:
        for name, info in g.tensors.items():
            if not g.in_file(info):
                continue  # the header row names it
            raw = np.frombuffer(os.pread(fd, info.nbytes, g.abs_offset(info)), np.uint8)
            got = dequantize_rows(raw.reshape(info.n_rows, info.row_bytes), info.type_name)
            if not np.isfinite(got).all():
                scan.nonfinite.append(name)
            if name in plan:
                _compare(scan, name, info.type_name, got.reshape(-1),
                         global_array(checkpoint, plan[name]).reshape(-1))  # fmt: skip
    except (KeyError, ValueError) as exc:
        scan.problems.append(f"unreadable ({exc})")
    finally:
        os.close(fd)
    return scan


def _compare(scan: _Scan, name: str, type_name: str, got: np.ndarray, want: np.ndarray) -> None:
    err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    scan.worst = max(scan.worst, err)
    limit, _ = tensor_threshold(type_name)
    if err > limit:
        scan.problems.append(f"{name} ({type_name}) is {err:.2e} from the source, over "
                             f"{limit:.0e}")  # fmt: skip
