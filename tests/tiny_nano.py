"""A tiny MOSS-TTS-Nano checkpoint written as the release writes it: config.json with the
release's keys, and upstream's state dict saved by torch.save (tied heads over their tables'
storage, the unused local_transformer.wte present)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from moss_gguf_cli.nano.checkpoint import expected_shapes
from moss_gguf_cli.nano.config import NanoConfig
from moss_gguf_cli.nano.tiny import CONFIG as TINY_NANO

# the release's keys (DESIGN §12) as builtin:tiny-nano has them, at tinier sizes
CONFIG = {
    **copy.deepcopy(TINY_NANO),
    "n_vq": 3,
    "audio_vocab_size": 16,
    "audio_pad_token_id": 16,
    "gpt2_config": {**TINY_NANO["gpt2_config"], "n_embd": 32, "n_inner": 48, "vocab_size": 40,
                    "n_positions": 64},  # fmt: skip
}


def nano_config(**gpt2: int) -> dict:
    """CONFIG with other gpt2_config sizes."""
    config = copy.deepcopy(CONFIG)
    config["gpt2_config"].update(gpt2)
    return config


def release_state(
    config: dict, dtype: torch.dtype = torch.bfloat16, seed: int = 1
) -> dict[str, torch.Tensor]:
    """A state dict as upstream's model.state_dict() has it: heads the same tensors as tables;
    norms near 1, everything else random at a scale that keeps every layer's work visible."""
    nano = NanoConfig.from_dict(config, Path("config.json"))
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in expected_shapes(nano).items():
        values = torch.randn(shape, generator=gen)
        if ".ln_" in name and name.endswith(".weight"):
            values = 1 + 0.1 * values
        elif ".h." in name and len(shape) == 2:  # a block's matrix: [out, in]
            values = values / shape[1] ** 0.5
        else:  # tables, biases
            values = 0.1 * values
        state[name] = values.to(dtype)
    state["text_lm_head.weight"] = state["transformer.wte.weight"]
    for q in range(nano.n_vq):
        state[f"audio_lm_heads.{q}.weight"] = state[f"audio_embeddings.{q}.weight"]
    state["local_transformer.wte.weight"] = torch.randn(nano.dims.vocab, nano.hidden).to(dtype)
    return state


def write_release(folder: Path, config: dict = CONFIG, state: dict | None = None) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    state = release_state(config) if state is None else state
    torch.save(state, folder / "pytorch_model.bin")
    return state
