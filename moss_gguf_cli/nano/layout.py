"""The Nano folder: what `all` makes of a MOSS-TTS-Nano checkpoint (docs/nano.md), its names,
and the arrays it holds.

    OUTPUT/
      nano_global_q8_0.gguf     the global transformer (nano/global_gguf.py), one per file type
      tables/                   wte.npy and audio_embeddings_00..15.npy, float32: the 17 input
                                tables, and the heads (tied to them: text head = wte,
                                audio head q = audio_embeddings_q)
      local_transformer/        its blocks and ln_f, one float32 .npy per tensor, upstream's names
                                and row order (the local rope is applied by the engine, unpermuted)
      tokenizer.model           the release's, copied
      config.json               the release's, copied (verify reads the model's facts there)
      audio_tokenizer/          the codec's ONNX release (nano/codec_folder.py), copied
      moss-tts-nano.yaml        what the folder is and how it speaks (`synth --config`); one
                                per GGUF
      manifest.json             size and sha256 of every file, made_from, the model's facts

Why float32 arrays and not a second GGUF: the local transformer is one block, run 17 times a
frame on one row, and the heads are 17 matrix-vector products (the text head only ever compares
ids 9 and 7). Per frame that is ~0.1 GB of reads at most, so the cost is per-call overhead, and
NumPy on float32 arrays reaches BLAS directly (NumPy has no float16 BLAS path: f16 would be
converted on every call, an allocation per frame that #48 forbids), where a llama.cpp context
adds a graph build and a round trip per step. float32 holds the release's bf16 exactly, so
verify compares them bit for bit.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..disk.layout_names import FAMILY_KEY
from .checkpoint import NanoCheckpoint, block_shapes
from .config import FAMILY_NAME, NanoConfig
from .local import DEFAULT_LOCAL_TYPE
from .settings import DEFAULT_N_CTX, NanoSettings

FORMAT = FAMILY_NAME
GLOBAL_STEM = "nano_global"
TABLES_DIR = "tables"
LOCAL_DIR = "local_transformer"
CODEC_DIR = "audio_tokenizer"
TOKENIZER_NAME = "tokenizer.model"
CONFIG_NAME = "moss-tts-nano.yaml"
DEFAULT_FILE_TYPE = "Q8_0"
ARRAY_DTYPE = np.dtype("<f4")


def gguf_name(file_type: str) -> str:
    return f"{GLOBAL_STEM}_{file_type.lower()}.gguf"


def config_name(index: int, gguf: str) -> str:
    """The first GGUF's synth config is CONFIG_NAME; each other GGUF's names its file."""
    return CONFIG_NAME if index == 0 else f"moss-tts-nano-{gguf[: -len('.gguf')]}.yaml"


def table_files(nano: NanoConfig) -> dict[str, str]:
    """tables/NAME.npy → the checkpoint tensor it holds: the text table, then each audio table."""
    files = {f"{TABLES_DIR}/wte.npy": "transformer.wte.weight"}
    files.update({f"{TABLES_DIR}/audio_embeddings_{q:02d}.npy": f"audio_embeddings.{q}.weight"
                  for q in range(nano.n_vq)})  # fmt: skip
    return files


def local_files(nano: NanoConfig) -> dict[str, str]:
    """local_transformer/NAME.npy → the checkpoint tensor it holds (upstream's name, less its
    `local_transformer.` prefix)."""
    names = []
    for i in range(nano.local_layers):
        names += list(block_shapes(f"local_transformer.h.{i}.", nano.dims))
    names += ["local_transformer.ln_f.weight", "local_transformer.ln_f.bias"]
    prefix = len("local_transformer.")
    return {f"{LOCAL_DIR}/{name[prefix:]}.npy": name for name in names}


def array_files(nano: NanoConfig) -> dict[str, str]:
    return {**table_files(nano), **local_files(nano)}


def array_of(checkpoint: NanoCheckpoint, source: str) -> np.ndarray:
    """A tensor as its .npy holds it: float32, C order (bf16 and f16 widen exactly)."""
    return np.ascontiguousarray(checkpoint.tensors[source], dtype=ARRAY_DTYPE)


def synth_config(checkpoint: NanoCheckpoint, gguf: str, codec: str | None) -> dict:
    """What the folder is, for the Nano engine: every path relative to the YAML."""
    nano, dims = checkpoint.nano, checkpoint.nano.dims
    return {
        FAMILY_KEY: FAMILY_NAME,
        "global_gguf": gguf,
        "tables_dir": TABLES_DIR,
        "local_dir": LOCAL_DIR,
        "heads": "tied",  # text head = tables/wte.npy, audio head q = audio_embeddings_q
        "tokenizer": TOKENIZER_NAME,
        "audio_tokenizer_dir": codec,
        "n_vq": nano.n_vq,
        "audio_pad_token_id": nano.audio_pad,
        **nano.tokens,
        "n_embd": dims.hidden,
        "n_head": dims.heads,
        "n_layer": dims.layers,
        "local_layers": nano.local_layers,
        "layer_norm_epsilon": dims.eps,
        "rope_base": dims.rope_base,
        # how it speaks (nano/settings.py): upstream's running defaults, editable here
        "n_ctx": DEFAULT_N_CTX,
        "n_threads": 0,
        "local_type": DEFAULT_LOCAL_TYPE,  # the local transformer at run time (nano/ggml_local.py)
        **dataclasses.asdict(NanoSettings()),
    }
