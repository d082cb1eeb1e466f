"""Tiny MOSS Audio Tokenizer checkpoints for the tests: upstream's config keys, module structure
and tensor names (OpenMOSS/MOSS-Audio-Tokenizer, modeling_moss_audio_tokenizer.py), small dims.

Values come from a seeded generator, so a checkpoint is the same bytes on every machine: the
golden hashes of tests/test_audio_codec.py depend on it (and on the folder's name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from moss_gguf_cli.source.audio_tokenizer_checkpoint import expected_shapes


def transformer(
    n_in: int, n_out: int, d: int, heads: int, layers: int, *, layer_scale: float | None = 0.01
) -> dict[str, Any]:
    m = {
        "causal": True,
        "conv_layout": True,
        "d_model": d,
        "dim_feedforward": 4 * d,
        "gating": "none",
        "input_dimension": n_in,
        "max_period": 10000,
        "module_type": "Transformer",
        "norm": "layer_norm",
        "num_heads": heads,
        "num_layers": layers,
        "output_dimension": n_out,
        "positional_embedding": "rope",
    }
    if layer_scale is not None:
        m["layer_scale"] = layer_scale
    return dict(sorted(m.items()))


def patch(size: int) -> dict[str, Any]:
    return {"module_type": "PatchedPretransform", "patch_size": size}


@dataclass
class CodecSpec:
    encoder: list[dict[str, Any]]
    decoder: list[dict[str, Any]]
    quantizer: dict[str, Any]
    sampling_rate: int = 24000
    downsample_rate: int = 1920
    context_seconds: int | float = 10
    dtype: torch.dtype = torch.float32
    shards: int = 2  # 1 with index=False: one model.safetensors
    index: bool = True
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        return {
            "architectures": ["MossAudioTokenizerModel"],
            "causal_transformer_context_duration": self.context_seconds,
            "code_dim": self.quantizer["output_dim"],
            "decoder_kwargs": self.decoder,
            "downsample_rate": self.downsample_rate,
            "dtype": "float32",
            "encoder_kwargs": self.encoder,
            "model_type": "speech_tokenizer",
            "quantizer_kwargs": self.quantizer,
            "quantizer_type": self.quantizer["quantizer_type"],
            "sampling_rate": self.sampling_rate,
            **self.extra,
        }


# Like the real tokenizer: patch, transformers between patches, a 1280-wide decoder head
# shrunk to 16; rvq_dim differs from input/output (both quantizer projections exist).
REAL_LIKE = CodecSpec(
    encoder=[patch(8), transformer(8, 12, 16, 2, 2), patch(2), transformer(24, 16, 16, 2, 1)],
    decoder=[transformer(16, 24, 16, 2, 1), patch(2), transformer(12, 8, 16, 2, 2), patch(8)],
    quantizer={
        "codebook_dim": 4,
        "codebook_size": 16,
        "input_dim": 16,
        "num_quantizers": 3,
        "output_dim": 16,
        "quantizer_type": "rlfq",
        "rvq_dim": 12,
    },
    downsample_rate=16,
)
# Another module list: one transformer a side, no layer scale, a transformer first in the
# encoder whose d_model equals its input (no input_proj), odd sizes, bf16 in three shards.
ODD = CodecSpec(
    encoder=[transformer(6, 10, 6, 3, 1, layer_scale=None), patch(3)],
    decoder=[patch(3), transformer(10, 6, 20, 4, 1, layer_scale=None)],
    quantizer={
        "codebook_dim": 3,
        "codebook_size": 8,
        "input_dim": 30,
        "num_quantizers": 2,
        "output_dim": 30,
        "quantizer_type": "rlfq",
        "rvq_dim": 14,
    },
    sampling_rate=16000,
    downsample_rate=3,
    context_seconds=2.5,
    dtype=torch.bfloat16,
    shards=3,
    seed=7,
)


def tensors(spec: CodecSpec) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(spec.seed)
    out = {}
    for name, shape in sorted(expected_shapes(spec.config()).items()):
        values = rng.standard_normal(shape).astype(np.float32) * 0.1
        if name.endswith("original0"):
            values = np.abs(values) + 0.5  # a weight norm's g
        out[name] = torch.from_numpy(values).to(spec.dtype)
    return out


def write_codec(folder: Path, spec: CodecSpec) -> Path:
    """FOLDER with config.json and the weights (index + shards, or one model.safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(spec.config(), indent=2) + "\n")
    data = tensors(spec)
    if not spec.index:
        save_file(data, str(folder / "model.safetensors"))
        return folder
    names = list(data)
    weight_map = {}
    for k in range(spec.shards):
        shard = f"model-{k + 1:05d}-of-{spec.shards:05d}.safetensors"
        part = {n: data[n] for n in names[k :: spec.shards]}
        save_file(part, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(t.numel() * t.element_size() for t in data.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return folder
