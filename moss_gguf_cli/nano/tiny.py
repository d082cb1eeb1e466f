"""`builtin:tiny-nano`: a random tiny MOSS-TTS-Nano checkpoint in the release's exact layout,
made at run time without torch, and the tiny codec in the codec release's layout.

The folder holds what `OpenMOSS-Team/MOSS-TTS-Nano-100M` holds: config.json with the release's
keys, `pytorch_model.bin` (written by source/torch_save: the state dict's order and names,
bf16, each head and its table one storage, the unused `local_transformer.wte` present) and
`tokenizer.model` (nano/data/tiny_nano_tokenizer.model: SentencePiece BPE with byte fallback,
`<unk> <s> </s> <pad>` at 0-3 and the six control tokens at 4-9, made by
scripts/make_tiny_nano_tokenizer.py). Dims are the release's in small: 16 codebooks of 1024
(the tiny codec's), a hidden size of 256 so llama.cpp's K-quants apply, the text vocabulary the
tokenizer's 384 pieces. Built deterministically in under a second and cached beside builtin:tiny.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..bf16 import bfloat16
from ..source.tiny import cache_root, ensure_family_builtin
from .checkpoint import TOKENIZER_NAME, TORCH_NAME, expected_shapes, tied_names
from .config import NanoConfig
from .tiny_codec import ensure_tiny_nano_codec

NAME = "tiny-nano"
BUILDER_VERSION = 1  # bump when the generated files change
TOKENIZER_DATA = "tiny_nano_tokenizer.model"
CONFIG: dict[str, Any] = {
    "architectures": ["MossTTSNanoForCausalLM"],
    "model_type": "moss_tts_nano",
    "model_architecture": "global_local_transformer",
    "n_vq": 16,
    "audio_vocab_size": 1024,
    "audio_pad_token_id": 1024,
    "pad_token_id": 3,
    "im_start_token_id": 4,
    "im_end_token_id": 5,
    "audio_start_token_id": 6,
    "audio_end_token_id": 7,
    "audio_user_slot_token_id": 8,
    "audio_assistant_slot_token_id": 9,
    "local_transformer_layers": 1,
    "gpt2_config": {
        "n_embd": 256,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": 1024,
        "vocab_size": 384,
        "n_positions": 2048,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "position_embedding_type": "rope",
        "rope_base": 10000,
    },
}


def tiny_nano_state(config: dict[str, Any] = CONFIG, seed: int = 0) -> dict[str, np.ndarray]:
    """The state dict as upstream's model.state_dict() orders it, bf16: heads the same arrays
    as their tables; norms near 1, a block's matrices scaled by 1/sqrt(fan-in), the rest small."""
    nano = NanoConfig.from_dict(config, Path("config.json"))
    rng = np.random.default_rng(seed)
    tied = tied_names(nano)
    state: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(nano).items():
        if name in tied:
            continue
        values = rng.standard_normal(shape, dtype=np.float32)
        if ".ln_" in name and name.endswith(".weight"):
            values = 1 + 0.1 * values
        elif ".h." in name and len(shape) == 2:
            values = values / np.float32(shape[1] ** 0.5)
        else:
            values = 0.1 * values
        state[name] = values.astype(bfloat16())
        if name == "transformer.ln_f.bias":  # upstream's module order: the unused table next
            local = rng.standard_normal((nano.dims.vocab, nano.hidden), dtype=np.float32)
            state["local_transformer.wte.weight"] = (0.1 * local).astype(bfloat16())
    for head, table in tied.items():
        state[head] = state[table]  # one object: one storage in the file
    return state


def write_tiny_nano(folder: Path) -> Path:
    """The checkpoint's three files in FOLDER."""
    # lazy: the writer's bf16 storage type imports ml_dtypes (half a second; bf16.py)
    from ..source.torch_save import write_state_dict

    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")

    write_state_dict(folder / TORCH_NAME, tiny_nano_state())
    shipped = resources.files("moss_gguf_cli.nano") / "data" / TOKENIZER_DATA
    (folder / TOKENIZER_NAME).write_bytes(shipped.read_bytes())
    return folder


def ensure_tiny_nano(variant: str = NAME) -> Path:
    """The cached builtin:tiny-nano checkpoint folder, built on first use (atomically)."""
    return ensure_family_builtin(variant, NAME, BUILDER_VERSION, write_tiny_nano, "Nano")


def ensure_tiny_nano_codec_folder() -> Path:
    """The builtin's codec: the tiny codec in the ONNX release's layout."""
    return ensure_tiny_nano_codec(cache_root() / "builtin" / "tiny-nano-codec")
