"""The MOSS-Audio-Tokenizer-Nano ONNX release (the codec MOSS-TTS-Nano speaks through),
opened and checked before any work, and the contract of its streaming decoder.

The folder holds `codec_browser_onnx_meta.json` and the three graphs it names (`files`:
encode, decode_full, decode_step) with their external data; `codec_config` gives the sample
rate, channels and codebooks; `streaming_decode` names decode_step's state: each input NAME is
answered by an output of its own, fed back on the next call, and starts at zeros (positions
at -1), as upstream's runtime does. Every path the meta names must stay inside the folder.
`open_nano_codec` checks the graphs' inputs and outputs by name from the graphs alone (their
weights are not loaded); `initial_state` / `next_state` are what a streaming decode runs on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..disk.confine import boundary, child, confined, present
from ..errors import InputError

META = "codec_browser_onnx_meta.json"
DEFAULT_REPO = "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano-ONNX"
HUB_PATTERNS = [META, "*.onnx", "*.data", "*.onnx.data", "*.onnx_data"]
ROLES = ("encode", "decode_full", "decode_step")
# the inputs and outputs each graph must have, by name (decode_step adds its state)
NAMES = {
    "encode": (("waveform", "input_lengths"), ("audio_codes", "audio_code_lengths")),
    "decode_full": (("audio_codes", "audio_code_lengths"), ("audio", "audio_lengths")),
    "decode_step": (("audio_codes", "audio_code_lengths"), ("audio", "audio_lengths")),
}
_HINT = f"download the codec's ONNX release again ({DEFAULT_REPO})"


@dataclass(frozen=True)
class StateTensor:
    """One tensor of decode_step's state: fed as INPUT, answered as OUTPUT."""

    input: str
    output: str
    shape: tuple[int, ...]
    dtype: str  # "int32" or "float32"
    start: int = 0  # the value a fresh stream starts from


@dataclass(frozen=True)
class NanoCodec:
    """A checked Nano codec folder."""

    folder: Path
    meta: dict
    graphs: dict[str, Path]  # role → graph file
    files: list[Path]  # every file the folder's use reads, relative, sorted
    sample_rate: int
    channels: int
    n_vq: int
    codebook_size: int | None
    state: tuple[StateTensor, ...]


# an attention cache's four state tensors: (key prefix, shape key, dtype, fresh value)
_CACHE_PARTS = (("offset", "offset_shape", "int32", 0),
                ("cached_keys", "cache_shape", "float32", 0),
                ("cached_values", "cache_shape", "float32", 0),
                ("cached_positions", "positions_shape", "int32", -1))  # fmt: skip


def _state(meta: dict, path: Path) -> tuple[StateTensor, ...]:
    stream = meta.get("streaming_decode") or {}
    out = []
    try:
        for spec in stream.get("transformer_offsets", []):
            out.append(StateTensor(str(spec["input_name"]), str(spec["output_name"]),
                                   tuple(int(d) for d in spec["shape"]), "int32"))  # fmt: skip
        for spec in stream.get("attention_caches", []):
            for key, shape, dtype, start in _CACHE_PARTS:
                dims = tuple(int(d) for d in spec[shape])
                out.append(StateTensor(str(spec[f"{key}_input_name"]),
                                       str(spec[f"{key}_output_name"]), dims, dtype, start))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"its streaming_decode state is malformed ({exc!r})", path=path,
                         hint=_HINT) from None  # fmt: skip
    return tuple(out)


def read_meta(folder: Path) -> dict:
    path = Path(folder) / META
    if not present(path):
        raise InputError(f"no {META} here: not the Nano codec's ONNX release", path=folder,
                         hint=_HINT)  # fmt: skip
    confined(path, boundary(folder))
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"cannot be read as JSON ({exc})", path=path, hint=_HINT) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        raise InputError("has no files table", path=path, hint=_HINT)
    return meta


def open_nano_codec(folder: Path) -> NanoCodec:
    """The Nano codec in FOLDER, its meta and graphs checked (seconds; no weights loaded)."""
    folder = Path(folder)
    meta = read_meta(folder)
    path = folder / META
    graphs: dict[str, Path] = {}
    files = {path}
    for role in ROLES:
        name = meta["files"].get(role)
        if not isinstance(name, str):
            raise InputError(f"names no {role} graph", path=path, hint=_HINT)
        graph = child(folder, name, f"the {role} graph", path)
        if not present(graph):
            raise InputError(f"names {name} as the {role} graph; it is not there", path=path,
                             hint=_HINT)  # fmt: skip
        graphs[role] = confined(graph, boundary(folder))
        files |= {graph, *_external_data(graph, folder)}
    try:
        config = meta["codec_config"]
        rate, channels = int(config["sample_rate"]), int(config["channels"])
        n_vq = int(config["num_quantizers"])
        size = int(config["codebook_size"]) if "codebook_size" in config else None
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"its codec_config lacks {exc}", path=path, hint=_HINT) from None
    state = _state(meta, path)
    for role, graph in graphs.items():
        _check_names(graph, role, state if role == "decode_step" else ())
    return NanoCodec(folder, meta, graphs, sorted(f.relative_to(folder) for f in files),
                     rate, channels, n_vq, size, state)  # fmt: skip


def _external_data(graph: Path, folder: Path) -> list[Path]:
    """The external-data files GRAPH's weights name: beside it, inside the folder, present."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    found = set()
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        data = child(graph.parent, location, f"{graph.name}'s external data", graph)
        if not present(data):
            raise InputError(f"needs {location}, which is not beside it", path=graph,
                             hint=_HINT)  # fmt: skip
        found.add(confined(data, boundary(folder)))
    return sorted(found)


def _check_names(graph: Path, role: str, state: tuple[StateTensor, ...]) -> None:
    import onnx

    try:
        model = onnx.load(str(graph), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise InputError(f"not a readable ONNX graph ({exc})", path=graph, hint=_HINT) from None
    ins = {v.name for v in model.graph.input} - {t.name for t in model.graph.initializer}
    outs = {v.name for v in model.graph.output}
    want_in, want_out = NAMES[role]
    missing = [n for n in (*want_in, *(s.input for s in state)) if n not in ins]
    missing += [n for n in (*want_out, *(s.output for s in state)) if n not in outs]
    if missing:
        raise InputError(f"the {role} graph lacks {', '.join(missing)}", path=graph, hint=_HINT)


def initial_state(codec: NanoCodec) -> dict[str, np.ndarray]:
    """decode_step's state for a fresh stream: zeros, positions at -1."""
    return {s.input: np.full(s.shape, s.start, dtype=s.dtype) for s in codec.state}


def next_state(codec: NanoCodec, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The state to feed the next call, from this call's outputs by name."""
    return {s.input: outputs[s.output] for s in codec.state}
