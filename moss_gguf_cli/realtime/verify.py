"""`verify` of a MOSS-TTS-Realtime folder (realtime/layout.py): its own rows.

Rows: the manifest's files (there, of the listed size and sha256); the folder's parts (each
GGUF the manifest lists, the tokenizer, each synth config's paths, the codec's graphs); each
GGUF's header against config.json (the backbone a `qwen3` of the config's dims and names, the
depth GGUF every tensor of its plan at its shape); and the values against the source: every
tensor dequantized against the checkpoint's (F32, and BF16 from a bf16 source, bit for bit; a
quantized type within its limit). The source is --source, else the builtin or the folder the
manifest says the folder was made from, where it is still here; without one the values are a
warning row.
"""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np

from ..errors import InputError, UsageError
from ..native import libggml
from ..report import Rows
from ..source.audio_tokenizer import open_folder as open_codec
from ..verify.folder_files import folder_json, synth_config_problems
from ..verify.manifest import format_manifest, manifest_problems
from ..verify.quality import tensor_threshold
from ..verify.result import GROUPS, VerifyReport
from ..verify.tensors import dequantize_rows
from .checkpoint import RealtimeCheckpoint, expected_shapes, open_realtime
from .config import RealtimeConfig
from .depth_gguf import depth_names
from .layout import BACKBONE_STEM, CODEC_DIR, FORMAT
from .prompt import text_encoder
from .tiny import NAME as TINY
from .tiny import ensure_tiny_realtime
from .verify_deep import deep_rows

KIND = "realtime"
YAML_PATHS = ("backbone_gguf", "depth_gguf", "tokenizer_dir", "audio_decoder_onnx",
              "audio_encoder_onnx")  # fmt: skip


def realtime_manifest(path: Path) -> dict | None:
    """The manifest of a Realtime folder, None when PATH is not one."""
    return format_manifest(path, FORMAT)


def verify_realtime(target: Path, source: str | None, deep: bool) -> VerifyReport:
    """The Realtime rows for the folder TARGET; failing checks are rows."""
    started = time.perf_counter()
    folder = Path(target).expanduser()
    manifest = realtime_manifest(folder) or {}
    rows = Rows()
    rows.group = "manifest"
    n = len(manifest.get("files") or [])
    rows.check("manifest files", manifest_problems(folder, manifest),
               f"{n} files, sizes and sha256 as listed")  # fmt: skip
    config_path = folder / "config.json"
    rt = RealtimeConfig.from_dict(folder_json(config_path), config_path)
    ggufs = _file_rows(folder, manifest, rows)
    rows.group = "gguf"
    readers = {}
    for path in ggufs:
        try:
            readers[path] = gguf.GGUFReader(path)
        except (OSError, ValueError) as exc:
            rows.add(f"{path.name}: header", "fail", f"not a readable GGUF ({exc})"[:200])
    for path, reader in readers.items():
        expected = _expected(path, rt)
        rows.check(f"{path.name}: tensors", _header_problems(reader, expected),
                   f"{len(expected)} tensors, names and shapes as config.json implies")
    rows.group = "source"
    checkpoint = _source(folder, manifest, source, rows)
    if deep and checkpoint is None:  # before minutes of value checks
        raise UsageError("--deep compares ours with the exact files written from the source, "
                         "and the source is not here", path=folder,
                         hint="pass --source with the checkpoint the folder was made from")
    steered = bool((manifest.get("made_from") or {}).get("imatrix"))
    if checkpoint is not None:
        for path, reader in readers.items():
            rows.check(f"{path.name}: values", _value_problems(reader, path, checkpoint, steered),
                       "every tensor is the source's, bit for bit as written")
    if deep and checkpoint is not None:
        deep_rows(checkpoint, {p: manifest["quant_types"][p.name] for p in readers},
                  text_encoder(folder), rows)  # fmt: skip
    return VerifyReport(
        target=folder, kind=KIND, rows=sorted(rows.rows, key=lambda r: GROUPS.index(r.group)),
        model={"family": FORMAT, "rvq": rt.rvq, "hidden": rt.hidden,
               "layers": rt.backbone.layers, "depth_layers": rt.depth.layers},
        seconds=time.perf_counter() - started,
    )  # fmt: skip


def _file_rows(folder: Path, manifest: dict, rows: Rows) -> list[Path]:
    rows.group = "files"
    names = sorted(manifest.get("quant_types") or {})
    missing = [n for n in names if not (folder / n).is_file()]
    rows.check("GGUFs", missing + ([] if names else ["the manifest lists none"]),
               ", ".join(names))  # fmt: skip
    rows.check("tokenizer", [] if (folder / "tokenizer.json").is_file()
               else ["tokenizer.json is missing"], "tokenizer.json")  # fmt: skip
    rows.check("synth config", synth_config_problems(folder, YAML_PATHS),
               "every path names what exists")  # fmt: skip
    if (folder / CODEC_DIR).is_dir():
        try:
            codec = open_codec(folder / CODEC_DIR)
            rows.add("audio tokenizer", "pass", f"decoder {codec.decoder.as_posix()}, encoder "
                     f"{codec.encoder.as_posix() if codec.encoder else 'none'}")  # fmt: skip
        except InputError as exc:
            rows.add("audio tokenizer", "fail", exc.message, exc.hint or "")
    else:
        rows.add("audio tokenizer", "warn", "none: the folder cannot speak",
                 "moss-gguf all --audio-tokenizer OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX")
    return [folder / n for n in names if n not in missing]


def _expected(path: Path, rt: RealtimeConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF name → (checkpoint name, shape rows first) of every tensor PATH should hold."""
    shapes = expected_shapes(rt)
    if path.name.startswith(BACKBONE_STEM):
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, rt.backbone.layers)
        out = {}
        for qwen, _ in _backbone_names(rt):
            out[names.get_name(qwen, try_suffixes=(".weight",))] = _backbone_source(qwen)
        return {k: (v, shapes[v]) for k, v in out.items()}
    return {k: (v, shapes[v]) for k, v in depth_names(rt.rvq, rt.depth.layers)}


def _backbone_names(rt: RealtimeConfig) -> list[tuple[str, str]]:
    """(Qwen3ForCausalLM name, checkpoint name) of the backbone's tensors."""
    shapes = expected_shapes(rt)
    pairs = [("model.embed_tokens.weight", "embed_tokens.0.weight")]
    pairs += [("model." + n[len("language_model."):], n) for n in shapes
              if n.startswith("language_model.") and n != "language_model.embed_tokens.weight"]
    return pairs


def _backbone_source(qwen: str) -> str:
    if qwen == "model.embed_tokens.weight":
        return "embed_tokens.0.weight"
    return "language_model." + qwen[len("model."):]


def _header_problems(reader: gguf.GGUFReader, expected: dict) -> list[str]:
    have = {t.name: t for t in reader.tensors}
    problems = [f"{n} is missing" for n in expected if n not in have]
    problems += [f"{n} is not one the folder holds" for n in have if n not in expected]
    for name, (_, shape) in expected.items():
        t = have.get(name)
        if t is not None and tuple(int(x) for x in reversed(t.shape)) != shape:
            problems.append(f"{name} has shape {list(reversed(t.shape))}, not {list(shape)}")
    return problems[:4] + ([f"and {len(problems) - 4} more"] if len(problems) > 4 else [])


def _source(folder: Path, manifest: dict, source: str | None,
            rows: Rows) -> RealtimeCheckpoint | None:  # fmt: skip
    if source is None:
        made = str(manifest.get("source_model") or "")
        if made == f"builtin:{TINY}":
            source = str(ensure_tiny_realtime())
        elif made and Path(made).expanduser().is_dir():
            source = made
    if source is None:
        rows.add("source values", "warn", "the source is not here: values not compared",
                 "pass --source with the checkpoint the folder was made from")
        return None
    checkpoint = open_realtime(Path(source).expanduser())
    rows.add("source", "pass", f"{checkpoint.root} ({checkpoint.dtype})")
    return checkpoint


def _value_problems(reader: gguf.GGUFReader, path: Path, checkpoint: RealtimeCheckpoint,
                    imatrix: bool) -> list[str]:  # fmt: skip
    """Each tensor against the source: F32 and the source's own dtype bit for bit, F16 as the
    source rounded to it; a quantized type byte for byte as ggml's quantizer makes it of the
    source (what llama-quantize and the depth writer run), or, where an importance matrix
    steered llama-quantize (IMATRIX), within the type's limit."""
    expected = _expected(path, checkpoint.realtime)
    problems = []
    for t in reader.tensors:
        if t.name not in expected:
            continue
        if tuple(int(x) for x in reversed(t.shape)) != expected[t.name][1]:
            continue  # its header row says so
        ref = checkpoint.tensors[expected[t.name][0]].read_f32()
        kind, raw = t.tensor_type.name, np.asarray(t.data)
        rows = raw.reshape(ref.shape[0] if ref.ndim == 2 else 1, -1).view(np.uint8)
        if kind in ("F32", "F16", "BF16"):
            ours = dequantize_rows(rows, kind).reshape(ref.shape)
            want = ref.astype(np.float16).astype(np.float32) if kind == "F16" else ref
            if kind == "BF16" and checkpoint.dtype != "BF16":
                want = dequantize_rows(_quantized(ref, t.tensor_type), kind).reshape(ref.shape)
            if not np.array_equal(ours, want):
                problems.append(f"{t.name} ({kind}) differs from the source")
        elif not imatrix:
            if not np.array_equal(rows.reshape(-1), _quantized(ref, t.tensor_type)):
                problems.append(f"{t.name} ({kind}) is not ggml's {kind} of the source")
        else:
            limit, _ = tensor_threshold(kind)
            ours = dequantize_rows(rows, kind).reshape(ref.shape)
            err = float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))
            if err > limit:
                problems.append(f"{t.name} ({kind}) is {err:.2e} from the source, limit "
                                f"{limit:.1e}")  # fmt: skip
    return problems[:4] + ([f"and {len(problems) - 4} more"] if len(problems) > 4 else [])


def _quantized(ref: np.ndarray, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    """REF's rows as ggml's quantizer writes them in KIND (bytes)."""
    rows = np.ascontiguousarray(ref.reshape(ref.shape[0] if ref.ndim == 2 else 1, -1), np.float32)
    out = np.empty(rows.shape[0] * libggml.row_size(int(kind), rows.shape[1]), np.uint8)
    libggml.quantize_rows(int(kind), rows, out, 0, rows.shape[0], None)
    return out

