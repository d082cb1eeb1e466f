"""A MOSS-TTS-Realtime folder opened: its config, its tensors, checked against each other.

The release (`OpenMOSS-Team/MOSS-TTS-Realtime`) ships safetensors; one `model.safetensors` or an
index and its shards are read by the delay family's reader (source/checkpoint.read_tensors:
headers only, every shard confined to the folder), so opening reads no weight. The names are
upstream's module tree (moss_tts_realtime/mossttsrealtime/modeling_mossttsrealtime.py and
modeling_mossttsrealtime_local.py at 58b20a0):

    embed_tokens.0                      [vocab, hidden]    the text table the model reads
    embed_tokens.{1..rvq}               [audio_vocab, hidden]  one table a codebook
    language_model.embed_tokens         [vocab, hidden]    Qwen3Model's own table: upstream
                                                           feeds the backbone embeddings, so
                                                           it is never read (a duplicate)
    language_model.layers.{i}.*, language_model.norm       the Qwen3 backbone
    local_transformer.model.embed_tokens.{0..rvq-2}        [audio_vocab, hidden]  depth inputs
    local_transformer.model.layers.{i}.*, .model.norm      the depth transformer
    local_transformer.local_lm_heads.{0..rvq-1}            [audio_vocab, hidden]  a head a code

No LM head is stored: the backbone's is never used. At the release's dims that is 403 tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..disk.confine import boundary, confined, present
from ..errors import InputError
from ..gguf.qwen3_names import layer_shapes
from ..source.checkpoint import (
    INDEX_NAME,
    TOKENIZER_FILES,
    WEIGHT_DTYPES,
    TensorRef,
    folder_config,
    read_json,
    read_tensors,
)
from ..source.config_values import counts_agree
from .config import TITLE, QwenDims, RealtimeConfig, is_realtime

_HINT = "config.json and the weights disagree; download both again"
# what upstream's forward never reads: Qwen3Model's table (the model reads embed_tokens.0)
UNUSED = ("language_model.embed_tokens.weight",)


def layers_shapes(prefix: str, dims: QwenDims) -> dict[str, tuple[int, ...]]:
    """PREFIX + layers.{i}.* for every layer of DIMS, then PREFIX + norm."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(dims.layers):
        shapes.update(layer_shapes(f"{prefix}layers.{i}.", dims.hidden, dims.q_width,
                                   dims.kv_width, dims.ffn, dims.head_dim))  # fmt: skip
    shapes[f"{prefix}norm.weight"] = (dims.hidden,)
    return shapes


def expected_shapes(rt: RealtimeConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor upstream's model holds, with its shape from the config, in its module order."""
    h, rows = rt.hidden, rt.audio_vocab
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.0.weight": (rt.vocab, h)}
    shapes.update({f"embed_tokens.{q}.weight": (rows, h) for q in range(1, rt.rvq + 1)})
    shapes["language_model.embed_tokens.weight"] = (rt.vocab, h)
    shapes.update(layers_shapes("language_model.", rt.backbone))
    local = "local_transformer.model."
    shapes.update({f"{local}embed_tokens.{q}.weight": (rows, h) for q in range(rt.rvq - 1)})
    shapes.update(layers_shapes(local, rt.depth))
    shapes.update({f"local_transformer.local_lm_heads.{q}.weight": (rows, h)
                   for q in range(rt.rvq)})  # fmt: skip
    return shapes


@dataclass
class RealtimeCheckpoint:
    root: Path
    config: dict[str, Any]
    realtime: RealtimeConfig
    tensors: dict[str, TensorRef]  # read lazily: memory-mapped from their shard on demand
    shards: list[Path]
    weights: Path  # the index where there is one, else the one file
    tokenizer_files: list[Path] = field(default_factory=list)
    dtype: str = ""  # the weights' dtype as stored ("BF16"; mixed ones joined by "+")

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def is_realtime_folder(root: Path) -> bool:
    """A folder whose config.json says MOSS-TTS-Realtime (nothing else is read)."""
    config = folder_config(root)
    return config is not None and is_realtime(config)


def open_realtime(root: Path) -> RealtimeCheckpoint:
    """Read and check a Realtime folder: config first, then the safetensors headers, then every
    tensor's name, shape and dtype against the config. No weight is read."""
    root = Path(root)
    if not root.is_dir():
        raise InputError("model folder not found", path=root)
    edge = boundary(root)
    config_path = root / "config.json"
    if not present(config_path):
        raise InputError("config.json is missing", path=root,
                         hint="point --model at a MOSS-TTS-Realtime checkpoint folder")  # fmt: skip
    config = read_json(confined(config_path, edge), "config.json")
    if not isinstance(config, dict):
        raise InputError("config.json is not a JSON object", path=config_path)
    rt = RealtimeConfig.from_dict(config, config_path)
    shards, tensors = read_tensors(root)
    weights = root / INDEX_NAME if present(root / INDEX_NAME) else shards[0]
    check_tensors(rt, tensors, weights)
    tokenizer = [confined(root / n, edge) for n in TOKENIZER_FILES if present(root / n)]
    expected = expected_shapes(rt)
    dtype = "+".join(sorted({tensors[name].dtype for name in expected}))
    return RealtimeCheckpoint(root, config, rt, tensors, shards, weights, tokenizer, dtype)


def check_tensors(rt: RealtimeConfig, tensors: dict[str, Any], weights: Path) -> None:
    """TENSORS (name → anything with .shape and .dtype, a safetensors dtype name) are the
    checkpoint RT describes: counts borne out, each name present at its shape, none unknown,
    every one a float. Each refusal is one line naming the first offender and WEIGHTS."""
    counts_agree((("language_config.num_hidden_layers", rt.backbone.layers,
                   "language_model.layers.", "backbone layers"),
                  ("local_config.num_hidden_layers", rt.depth.layers,
                   "local_transformer.model.layers.", "depth layers"),
                  ("rvq", rt.rvq, "local_transformer.local_lm_heads.", "depth heads")),
                 tensors, weights, _HINT)  # fmt: skip
    expected = expected_shapes(rt)
    for name, shape in expected.items():
        tensor = tensors.get(name)
        if tensor is None:
            raise InputError(f"tensor {name!r} is missing", path=weights, hint=_HINT)
        if tuple(tensor.shape) != shape:
            raise InputError(f"tensor {name!r} has shape {list(tensor.shape)} but config.json "
                             f"implies {list(shape)}", path=weights, hint=_HINT)  # fmt: skip
    unknown = sorted(n for n in tensors if n not in expected)
    if unknown:
        raise InputError(f"tensor {unknown[0][:120]!r} is not one {TITLE} has "
                         f"({len(unknown)} such)", path=weights,
                         hint="the weights are of another model or another version of "
                         f"{TITLE}")  # fmt: skip
    odd = [name for name in expected if tensors[name].dtype not in WEIGHT_DTYPES]
    if odd:
        more = f" (and {len(odd) - 1} more tensors)" if len(odd) > 1 else ""
        raise InputError(f"tensor {odd[0]!r} is stored as {tensors[odd[0]].dtype}{more}; {TITLE} "
                         "weights are F32, F16 or BF16", path=weights,
                         hint="the weights are of another model or a broken export")  # fmt: skip
