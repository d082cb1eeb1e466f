"""MOSS-TTS-Nano's config, read from its config.json alone.

Upstream's `MossTTSNanoConfig` class has defaults that differ from the release's file (n_vq 8,
Qwen-sized token ids, 4 local layers), and GPT2Config's defaults are GPT-2's (learned positions,
1024 of them); so nothing here falls back on a default: every fact the conversion and the
engine use must be in the file, and a file that lacks one is refused naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UnsupportedModelError
from ..source.config_values import MOST_CODEBOOKS, MOST_LAYERS, MOST_ROWS, MOST_WIDTH, ConfigValues

FAMILY_NAME = "moss-tts-nano"  # its folders' manifest format and synth config's family
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


# torch's other names for the dtypes a config may say (`torch.float16` is written "float16")
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64"}


def declared_dtype(config: dict[str, Any]) -> str | None:
    """The dtype CONFIG says the weights are: `dtype` (transformers >= 4.56 writes this), else
    `torch_dtype`; None where it says none or "auto". Never used to read the weights, which are
    read as stored: the release says "float32" over bf16 weights (docs/nano.md)."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if isinstance(value, str) and value:
            name = value.removeprefix("torch.")
            if name == "auto" or not name.isidentifier() or len(name) > 32:
                return None  # a value no dtype has: nothing to compare
            return _DTYPE_ALIASES.get(name, name)
    return None


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


def _parse(config: dict[str, Any], path: Path) -> NanoConfig:
    gpt2 = _need(config, "gpt2_config", "", path)
    if not isinstance(gpt2, dict):
        raise InputError("config.json's gpt2_config is not an object", path=path, hint=_HINT)
    dims = _dims(gpt2, path)
    v = ConfigValues(path, "MOSS-TTS-Nano", _HINT)
    n_vq = v.positive(_need(config, "n_vq", "", path), "n_vq", MOST_CODEBOOKS)
    sizes = config.get("audio_codebook_sizes")
    if sizes is None:
        sizes = [_need(config, "audio_vocab_size", "", path)] * n_vq
    if not isinstance(sizes, list) or len(sizes) != n_vq:
        raise InputError(f"config.json's audio_codebook_sizes is not {n_vq} sizes", path=path)
    sizes = tuple(v.positive(s, "audio_codebook_sizes", MOST_ROWS) for s in sizes)
    pad = v.token(_need(config, "audio_pad_token_id", "", path), "audio_pad_token_id")
    if pad < max(sizes):
        raise InputError(
            f"config.json's audio_pad_token_id {pad} lies inside a codebook of {max(sizes)}",
            path=path,
            hint=_HINT,
        )
    tokens = {key: v.token(_need(config, key, "", path), key, dims.vocab) for key in TOKEN_KEYS}
    local = v.positive(_need(config, "local_transformer_layers", "", path),
                       "local_transformer_layers", MOST_LAYERS)  # fmt: skip
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
    v = ConfigValues(path, "MOSS-TTS-Nano", _HINT)

    def count(key: str, most: int = MOST_ROWS) -> int:
        return v.positive(_need(gpt2, key, where, path), where + key, most)

    hidden, heads = count("n_embd", MOST_WIDTH), count("n_head", MOST_WIDTH)
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
        layers=count("n_layer", MOST_LAYERS),
        heads=heads,
        inner=4 * hidden if inner is None else v.positive(inner, "gpt2_config.n_inner", MOST_ROWS),
        vocab=count("vocab_size"),
        context=None if context is None else v.positive(context, "gpt2_config.n_positions",
                                                        MOST_ROWS),  # fmt: skip
        # ggml asserts eps >= 0; 0 divides a constant row by zero
        eps=v.real(_need(gpt2, "layer_norm_epsilon", where, path),
                   "gpt2_config.layer_norm_epsilon", 0.0, 1.0),
        rope_base=v.real(_need(gpt2, "rope_base", where, path), "gpt2_config.rope_base",
                         1.0, 1e12),  # base**(-2i/d) must shrink: a base of 1 or less does not
        activation=activation,
    )
