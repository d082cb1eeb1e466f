"""The Realtime folder: what `all` makes of a MOSS-TTS-Realtime checkpoint (docs/realtime.md).

    OUTPUT/
      realtime_backbone_q8_0.gguf   the Qwen3 backbone, a stock `qwen3` GGUF
                                    (realtime/backbone_gguf.py), one per file type
      realtime_depth_q8_0.gguf      the audio input tables, the depth transformer and its
                                    tables and heads (realtime/depth_gguf.py), one per type
      tokenizer.json, tokenizer_config.json, vocab.json, merges.txt   the release's, copied
      config.json                   the release's, copied (verify reads the model's facts)
      audio_tokenizer/              the 24 kHz MOSS-Audio-Tokenizer's ONNX graphs, copied
      moss-tts-realtime.yaml        how the folder speaks (`synth --config`); one per type
      manifest.json                 size and sha256 of every file, made_from, the model's facts
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..disk.layout_names import FAMILY_KEY
from .checkpoint import RealtimeCheckpoint
from .config import FAMILY_NAME

FORMAT = FAMILY_NAME
BACKBONE_STEM = "realtime_backbone"
DEPTH_STEM = "realtime_depth"
CODEC_DIR = "audio_tokenizer"
CONFIG_NAME = "moss-tts-realtime.yaml"
DEFAULT_FILE_TYPE = "Q8_0"
TEXT_LEAD = 12  # text tokens the model reads ahead of the audio (upstream's inferencer)


@dataclasses.dataclass(frozen=True)
class RealtimeSettings:
    """How the folder speaks, editable in its synth config: the model card's sampling."""

    temperature: float = 0.8
    top_p: float = 0.6
    top_k: int = 30
    repetition_penalty: float = 1.1
    repetition_window: int = 50  # frames the penalty looks back over, per codebook
    max_new_tokens: int = 1500  # frames (120 s)
    min_new_tokens: int = 0  # frames before the audio EOS may end the speech
    n_ctx: int = 4096
    n_threads: int = 0  # 0: the physical cores
    kv_cache_type: str = "f16"  # the backbone's KV cache: f16, q8_0 or f32 (exact)
    flash_attn: str = "auto"  # auto, enabled, disabled (exact: no f16 rounding)


def gguf_name(stem: str, file_type: str) -> str:
    return f"{stem}_{file_type.lower()}.gguf"


def config_name(index: int, file_type: str) -> str:
    """The first type's synth config is CONFIG_NAME; each other type's names its type."""
    return CONFIG_NAME if index == 0 else f"moss-tts-realtime-{file_type.lower()}.yaml"


def synth_config(checkpoint: RealtimeCheckpoint, file_type: str, codec: dict | None,
                 tokenizer: str = ".") -> dict[str, Any]:  # fmt: skip
    """What the folder is, for the Realtime engine: every path relative to the YAML."""
    rt = checkpoint.realtime
    return {
        FAMILY_KEY: FAMILY_NAME,
        "backbone_gguf": gguf_name(BACKBONE_STEM, file_type),
        "depth_gguf": gguf_name(DEPTH_STEM, file_type),
        "tokenizer_dir": tokenizer,
        "audio_decoder_onnx": codec["decoder"] if codec else None,
        "audio_encoder_onnx": codec["encoder"] if codec else None,
        "rvq": rt.rvq,
        "audio_vocab_size": rt.audio_vocab,
        "audio_pad_token": rt.audio_pad,
        "reference_audio_pad": rt.reference_audio_pad,
        "text_pad": rt.text_pad,
        "hidden_size": rt.hidden,
        "text_lead": TEXT_LEAD,
        **dataclasses.asdict(RealtimeSettings()),
    }
