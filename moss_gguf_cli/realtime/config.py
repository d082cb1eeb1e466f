"""MOSS-TTS-Realtime's config, read from its config.json alone.

Upstream's `MossTTSRealtimeConfig` fills what the file lacks with class defaults, and its
local (depth) transformer's config sets `rvq`, `audio_vocab_size` and the pad row as constants
whatever the file says. Nothing here falls back on either: every fact the conversion and the
engine use must be in the file, a file that lacks one is refused naming the key, and where the
file says a fact twice (the top level and `local_config`) the two must agree.

The file's layout (upstream OpenMOSS/MOSS-TTS at 58b20a0, moss_tts_realtime/mossttsrealtime/
configuration_mossttsrealtime.py): top level `model_type`, `architectures`, `rvq`,
`audio_vocab_size`, `audio_pad_token`, `reference_audio_pad`, `text_pad`; `language_config` a
Qwen3Config (the backbone); `local_config` the depth transformer (Qwen3 layers too). The audio
BOS and EOS rows are in no config: upstream's processor puts them after the pad row (1025,
1026 after 1024), so a table holds the codes, then pad, BOS and EOS, and that layout is checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UnsupportedModelError
from ..source.config_values import MOST_CODEBOOKS, MOST_LAYERS, MOST_ROWS, MOST_WIDTH, ConfigValues

FAMILY_NAME = "moss-tts-realtime"  # its folders' manifest format and synth config's family
TITLE = "MOSS-TTS-Realtime"
MODEL_TYPE = "moss_tts_realtime"
ARCHITECTURE = "MossTTSRealtime"
LOCAL_MODEL_TYPE = "moss_tts_realtime_local_transformer"
_HINT = f"config.json should be {TITLE}'s own; download it again"
# the rows after the codes: pad, audio BOS, audio EOS (upstream's processor: 1024, 1025, 1026)
SPECIAL_ROWS = 3
# the rope forms that rotate as plain RoPE does: "linear" with factor 1 is the depth
# transformer's own (its config class writes {"rope_type": "linear", "factor": 1.0})
_PLAIN_ROPE = ("default", "linear")


def is_realtime(config: dict[str, Any]) -> bool:
    """Whether CONFIG (a config.json's object) says it is MOSS-TTS-Realtime: its model_type, or
    upstream's architecture name where a file lacks the type."""
    listed = config.get("architectures")
    archs = listed if isinstance(listed, list) else []
    return config.get("model_type") == MODEL_TYPE or ARCHITECTURE in archs


@dataclass(frozen=True)
class QwenDims:
    """One stack of Qwen3 decoder layers: q/k RMSNorm per head, SwiGLU, RMSNorm, RoPE on the
    two halves of each head (NEOX), no biases. The backbone's and the depth transformer's."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # intermediate_size
    rope_theta: float
    rms_eps: float
    context: int | None  # max_position_embeddings, where the file says it

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class RealtimeConfig:
    backbone: QwenDims  # language_config: the Qwen3 backbone, one row a frame
    depth: QwenDims  # local_config: the depth transformer, rvq positions a frame
    vocab: int  # language_config.vocab_size: rows of the text table
    tied: bool  # language_config.tie_word_embeddings (no LM head is stored or used either way)
    rvq: int  # codebooks a frame
    audio_vocab: int  # rows of each audio table and head: the codes, pad, BOS, EOS
    audio_pad: int  # the code of a cell without audio (audio_pad_token)
    reference_audio_pad: int  # the text id of a reference-audio row (<|audio_pad|>)
    text_pad: int  # the text id of a row whose text is used up (<|text_pad|>)

    @property
    def hidden(self) -> int:
        return self.backbone.hidden

    @property
    def codes(self) -> int:
        """Codes a codebook holds (0 .. codes - 1): the rows before the pad row."""
        return self.audio_pad

    @property
    def audio_bos(self) -> int:
        return self.audio_pad + 1

    @property
    def audio_eos(self) -> int:
        return self.audio_pad + 2

    @classmethod
    def from_dict(cls, config: dict[str, Any], path: Path) -> RealtimeConfig:
        claimed = is_realtime(config)
        if not claimed:
            raise UnsupportedModelError(
                f"model_type {str(config.get('model_type'))[:40]!r} is not {MODEL_TYPE!r}",
                path=path,
                hint="point --model at a MOSS-TTS-Realtime checkpoint folder",
            )
        try:
            return _parse(config, path)
        except (TypeError, ValueError) as exc:
            raise InputError(f"config.json has a value of the wrong type ({str(exc)[:80]})",
                             path=path, hint=_HINT) from None  # fmt: skip

    @classmethod
    def from_file(cls, path: Path) -> RealtimeConfig:
        """PATH (a config.json) read and checked; the caller has confined it to its folder."""
        path = Path(path)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"cannot read config.json ({exc.strerror})", path=path) from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise InputError(f"config.json is not valid JSON ({str(exc)[:80]})", path=path,
                             hint=_HINT) from None  # fmt: skip
        if not isinstance(config, dict):
            raise InputError("config.json is not a JSON object", path=path, hint=_HINT)
        return cls.from_dict(config, path)


def _need(section: dict[str, Any], key: str, where: str, path: Path) -> Any:
    if section.get(key) is None:
        raise InputError(f"config.json has no {where}{key}", path=path, hint=_HINT)
    return section[key]


def _section(config: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    section = _need(config, key, "", path)
    if not isinstance(section, dict):
        raise InputError(f"config.json's {key} is not an object", path=path, hint=_HINT)
    return section


def _parse(config: dict[str, Any], path: Path) -> RealtimeConfig:
    v = ConfigValues(path, TITLE, _HINT)
    language = _section(config, "language_config", path)
    local = _section(config, "local_config", path)
    backbone = _dims(language, "language_config.", v, path)
    depth = _dims(local, "local_config.", v, path)
    if depth.hidden != backbone.hidden:  # the backbone's last hidden state is depth position 0
        raise InputError(f"config.json's local_config.hidden_size {depth.hidden} is not "
                         f"language_config.hidden_size {backbone.hidden}; the depth transformer "
                         "starts from the backbone's hidden state", path=path,
                         hint=_HINT)  # fmt: skip
    vocab = v.positive(_need(language, "vocab_size", "language_config.", path),
                       "language_config.vocab_size", MOST_ROWS)  # fmt: skip
    rvq = v.positive(_need(config, "rvq", "", path), "rvq", MOST_CODEBOOKS)
    audio_vocab = v.positive(_need(config, "audio_vocab_size", "", path), "audio_vocab_size",
                             MOST_ROWS)  # fmt: skip
    pad = v.token(_need(config, "audio_pad_token", "", path), "audio_pad_token", audio_vocab)
    if pad + SPECIAL_ROWS != audio_vocab:
        raise InputError(f"config.json's audio_vocab_size {audio_vocab} is not audio_pad_token "
                         f"{pad} + 3 (the codes, then the pad, audio BOS and audio EOS rows)",
                         path=path, hint=_HINT)  # fmt: skip
    for key, value in (("rvq", rvq), ("audio_vocab_size", audio_vocab),
                       ("audio_pad_token", pad)):  # fmt: skip
        said = local.get(key)  # the depth transformer's copy, where the file has one
        if said is not None and said != value:
            raise InputError(f"config.json's local_config.{key} is {str(said)[:20]} but its "
                             f"top-level {key} is {value}", path=path, hint=_HINT)  # fmt: skip
    if depth.context is not None and depth.context < rvq:  # positions 0 .. rvq - 1 a frame
        raise InputError(f"config.json's local_config.max_position_embeddings {depth.context} "
                         f"is less than rvq {rvq}, the positions of a frame", path=path,
                         hint=_HINT)  # fmt: skip
    tied = language.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise InputError("config.json's language_config.tie_word_embeddings is not true or false",
                         path=path, hint=_HINT)  # fmt: skip
    return RealtimeConfig(
        backbone=backbone,
        depth=depth,
        vocab=vocab,
        tied=tied,
        rvq=rvq,
        audio_vocab=audio_vocab,
        audio_pad=pad,
        reference_audio_pad=v.token(_need(config, "reference_audio_pad", "", path),
                                    "reference_audio_pad", vocab),  # fmt: skip
        text_pad=v.token(_need(config, "text_pad", "", path), "text_pad", vocab),
    )


def _rope_theta(section: dict[str, Any], where: str, path: Path) -> Any:
    """rope_theta: the key itself, or inside `rope_parameters` (transformers 5 writes it there);
    a rope that scales positions is not what the engine computes."""
    params = section.get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    for scaling in (section.get("rope_scaling"), params):
        if not isinstance(scaling, dict):
            continue
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        factor = scaling.get("factor", 1.0)
        if kind not in _PLAIN_ROPE or factor != 1:
            raise UnsupportedModelError(
                f"config.json's {where}rope scales positions ({str(kind)[:20]}, factor "
                f"{str(factor)[:20]}); only plain RoPE is converted",
                path=path,
            )
    if section.get("rope_type", "default") not in _PLAIN_ROPE:
        raise UnsupportedModelError(f"config.json's {where}rope_type is "
                                    f"{str(section.get('rope_type'))[:20]!r}; only plain RoPE "
                                    "is converted", path=path)  # fmt: skip
    theta = section.get("rope_theta")
    theta = params.get("rope_theta") if theta is None else theta
    if theta is None:
        raise InputError(f"config.json has no {where}rope_theta", path=path, hint=_HINT)
    return theta


def _dims(section: dict[str, Any], where: str, v: ConfigValues, path: Path) -> QwenDims:
    if section.get("attention_bias"):
        raise UnsupportedModelError(f"config.json's {where}attention_bias is true; MOSS-TTS-"
                                    "Realtime's attention has no biases", path=path)  # fmt: skip
    act = section.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"config.json's {where}hidden_act is {str(act)[:20]!r}; only "
                                    "'silu' (SwiGLU) is converted", path=path)  # fmt: skip

    def count(key: str, most: int) -> int:
        return v.positive(_need(section, key, where, path), where + key, most)

    heads, kv_heads = count("num_attention_heads", MOST_WIDTH), count("num_key_value_heads",
                                                                       MOST_WIDTH)  # fmt: skip
    if heads % kv_heads:  # grouped attention asserts it
        raise InputError(f"config.json's {where}num_attention_heads {heads} is not a multiple of "
                         f"num_key_value_heads {kv_heads}", path=path, hint=_HINT)  # fmt: skip
    head_dim = count("head_dim", MOST_WIDTH)
    if head_dim % 2:  # RoPE turns pairs
        raise InputError(f"config.json's {where}head_dim {head_dim} is odd; RoPE rotates pairs",
                         path=path, hint=_HINT)  # fmt: skip
    context = section.get("max_position_embeddings")
    return QwenDims(
        hidden=count("hidden_size", MOST_WIDTH),
        layers=count("num_hidden_layers", MOST_LAYERS),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=count("intermediate_size", MOST_ROWS),
        # a base of 1 or less does not rotate; ggml asserts eps >= 0, and 0 divides by zero
        rope_theta=v.real(_rope_theta(section, where, path), where + "rope_theta", 1.0, 1e12),
        rms_eps=v.real(_need(section, "rms_norm_eps", where, path), where + "rms_norm_eps",
                       0.0, 1.0),  # fmt: skip
        context=None if context is None else v.positive(context, where + "max_position_embeddings",
                                                        MOST_ROWS),  # fmt: skip
    )
