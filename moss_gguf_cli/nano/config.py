"""MOSS-TTS-Nano's config, read from its config.json alone.

Upstream's `MossTTSNanoConfig` class has defaults that differ from the release's file (n_vq 8,
Qwen-sized token ids, 4 local layers), and GPT2Config's defaults are GPT-2's (learned positions,
1024 of them); so nothing here falls back on a default: every fact the conversion and the
engine use must be in the file, and a file that lacks one is refused naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UnsupportedModelError

MODEL_TYPE = "moss_tts_nano"
ARCHITECTURE = "global_local_transformer"
TOKEN_KEYS = (
    "pad_token_id",
    "im_start_token_id",
    "im_end_token_id",
    "audio_start_token_id",
    "audio_end_token_id",
    "audio_user_slot_token_id",
    "audio_assistant_slot_token_id",
)
_HINT = "config.json should be the release's own; download it again"
# Bounds far above any Nano (the release: 12 + 1 layers of 768, 16 codebooks of 1024) that keep
# a hostile count from becoming gigabytes of names and shapes before a tensor is read; whether a
# count agrees with the weights is checked when they are read (checkpoint.open_nano).
MOST_LAYERS = 1024
MOST_CODEBOOKS = 256
MOST_WIDTH = 1 << 16  # n_embd, n_head
MOST_ROWS = 1 << 24  # vocab_size, n_inner, a codebook, n_positions
MOST_ID = (1 << 31) - 1  # token ids travel as int32


def is_nano(config: dict[str, Any]) -> bool:
    """Whether CONFIG (a config.json's object) says it is MOSS-TTS-Nano."""
    return config.get("model_type") == MODEL_TYPE


@dataclass(frozen=True)
class TransformerDims:
    """The GPT-2 style decoder (`gpt2_config`): pre-LN blocks with biases, RoPE, no position
    table. The local transformer has the same blocks; only its layer count differs."""

    hidden: int  # n_embd
    layers: int  # n_layer
    heads: int  # n_head
    inner: int  # n_inner (null in the file means 4 × n_embd, as GPT-2 defines it)
    vocab: int
    context: int | None  # n_positions where the file says it (RoPE itself has no limit)
    eps: float  # layer_norm_epsilon
    rope_base: float
    activation: str

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class NanoConfig:
    n_vq: int
    codebook_sizes: tuple[int, ...]  # rows of each audio table and head
    audio_pad: int  # the code a row carries where it has no audio (outside every codebook)
    local_layers: int
    tokens: dict[str, int]  # TOKEN_KEYS → id
    dims: TransformerDims

    @property
    def hidden(self) -> int:
        return self.dims.hidden

    @classmethod
    def from_dict(cls, config: dict[str, Any], path: Path) -> NanoConfig:
        if not is_nano(config):
            raise UnsupportedModelError(
                f"model_type {config.get('model_type')!r} is not {MODEL_TYPE!r}", path=path
            )
        if config.get("model_architecture") != ARCHITECTURE:
            raise UnsupportedModelError(
                f"model_architecture {config.get('model_architecture')!r} is not "
                f"{ARCHITECTURE!r}, the only MOSS-TTS-Nano architecture converted",
                path=path,
                hint=_HINT,
            )
        try:
            return _parse(config, path)
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"config has a value of the wrong type ({exc})", path=path, hint=_HINT
            ) from None


def _need(section: dict[str, Any], key: str, where: str, path: Path) -> Any:
    if section.get(key) is None:
        raise InputError(f"config.json has no {where}{key}", path=path, hint=_HINT)
    return section[key]


def _positive(value: Any, name: str, path: Path, most: int = MOST_ROWS) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or int(value) != value or int(value) <= 0:
        raise InputError(f"config.json's {name} is {value!r}, not a positive integer", path=path)
    if value > most:
        raise InputError(f"config.json's {name} is {int(value)}, more than any MOSS-TTS-Nano "
                         f"has (at most {most} here)", path=path, hint=_HINT)  # fmt: skip
    return int(value)


def _token(value: Any, name: str, path: Path) -> int:
    """An id: a whole number an int32 holds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or int(value) != value or not 0 <= value <= MOST_ID:
        raise InputError(f"config.json's {name} is {value!r}, not a token id (a whole number "
                         f"from 0 to {MOST_ID})", path=path, hint=_HINT)  # fmt: skip
    return int(value)


def _real(value: Any, name: str, path: Path, low: float, high: float) -> float:
    """A number strictly between LOW and HIGH: what ggml accepts without an assertion."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not (math.isfinite(value) and low < value < high):
        raise InputError(f"config.json's {name} is {value!r}, not a number between {low:g} and "
                         f"{high:g}", path=path, hint=_HINT)  # fmt: skip
    return float(value)


def _parse(config: dict[str, Any], path: Path) -> NanoConfig:
    gpt2 = _need(config, "gpt2_config", "", path)
    if not isinstance(gpt2, dict):
        raise InputError("config.json's gpt2_config is not an object", path=path, hint=_HINT)
    dims = _dims(gpt2, path)
    n_vq = _positive(_need(config, "n_vq", "", path), "n_vq", path, MOST_CODEBOOKS)
    sizes = config.get("audio_codebook_sizes")
    if sizes is None:
        sizes = [_need(config, "audio_vocab_size", "", path)] * n_vq
    if not isinstance(sizes, list) or len(sizes) != n_vq:
        raise InputError(f"config.json's audio_codebook_sizes is not {n_vq} sizes", path=path)
    sizes = tuple(_positive(s, "audio_codebook_sizes", path) for s in sizes)
    pad = _token(_need(config, "audio_pad_token_id", "", path), "audio_pad_token_id", path)
    if pad < max(sizes):
        raise InputError(
            f"config.json's audio_pad_token_id {pad} lies inside a codebook of {max(sizes)}",
            path=path,
            hint=_HINT,
        )
    tokens = {key: _token(_need(config, key, "", path), key, path) for key in TOKEN_KEYS}
    outside = {k: v for k, v in tokens.items() if not 0 <= v < dims.vocab}
    if outside:
        key = next(iter(outside))
        raise InputError(
            f"config.json's {key} {tokens[key]} is outside the text vocabulary of {dims.vocab}",
            path=path,
            hint=_HINT,
        )
    local = _positive(_need(config, "local_transformer_layers", "", path),
                      "local_transformer_layers", path, MOST_LAYERS)  # fmt: skip
    return NanoConfig(n_vq, sizes, pad, local, tokens, dims)


def _dims(gpt2: dict[str, Any], path: Path) -> TransformerDims:
    where = "gpt2_config."
    kind = _need(gpt2, "position_embedding_type", where, path)
    if kind != "rope":
        raise UnsupportedModelError(
            f"gpt2_config.position_embedding_type is {kind!r}; only 'rope' is converted",
            path=path,
        )
    activation = str(_need(gpt2, "activation_function", where, path))
    if activation != "gelu_new":
        raise UnsupportedModelError(
            f"gpt2_config.activation_function is {activation!r}; only 'gelu_new' is converted",
            path=path,
        )
    hidden = _positive(_need(gpt2, "n_embd", where, path), "gpt2_config.n_embd", path, MOST_WIDTH)
    heads = _positive(_need(gpt2, "n_head", where, path), "gpt2_config.n_head", path, MOST_WIDTH)
    if hidden % heads or (hidden // heads) % 2:
        raise InputError(
            f"gpt2_config.n_embd {hidden} does not split into {heads} heads of an even size",
            path=path,
        )
    # upstream's attention reads these two with GPT-2's meaning when absent; others break it
    if gpt2.get("scale_attn_weights") is False or gpt2.get("scale_attn_by_inverse_layer_idx"):
        raise UnsupportedModelError(
            "gpt2_config scales attention otherwise than by 1/sqrt(head size); not converted",
            path=path,
        )
    inner = gpt2.get("n_inner")  # null: GPT-2's own rule, not a class default
    context = gpt2.get("n_positions")
    return TransformerDims(
        hidden=hidden,
        layers=_positive(_need(gpt2, "n_layer", where, path), "gpt2_config.n_layer", path,
                         MOST_LAYERS),  # fmt: skip
        heads=heads,
        inner=4 * hidden if inner is None else _positive(inner, "gpt2_config.n_inner", path),
        vocab=_positive(_need(gpt2, "vocab_size", where, path), "gpt2_config.vocab_size", path),
        context=None if context is None else _positive(context, "gpt2_config.n_positions", path),
        # ggml asserts eps >= 0; 0 divides a constant row by zero
        eps=_real(_need(gpt2, "layer_norm_epsilon", where, path),
                  "gpt2_config.layer_norm_epsilon", path, 0.0, 1.0),
        rope_base=_real(_need(gpt2, "rope_base", where, path), "gpt2_config.rope_base", path,
                        1.0, 1e12),  # base**(-2i/d) must shrink: a base of 1 or less does not
        activation=activation,
    )
