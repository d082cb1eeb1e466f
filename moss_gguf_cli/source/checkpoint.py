"""Open a MOSS source checkpoint: where it is, what it is, and its tensors.

Everything that decides "is this a MOSS delay model, and with which sizes" lives
here, read from the config and the tensors actually present — never constants.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..disk.confine import boundary, child, confined, present
from ..errors import InputError, UnsupportedModelError
from ..gguf.qwen3_names import layer_shapes
from ..gguf.stream import RowDelta
from ..progress import ProgressReporter
from .config_values import (
    MOST_CODEBOOKS,
    MOST_LAYERS,
    MOST_ROWS,
    MOST_WIDTH,
    ConfigValues,
    counts_agree,
)
from .hub import download, is_repo_id
from .safetensors_io import TensorInfo, read_header, to_f32
from .token_ids import TOKEN_DEFAULTS

log = logging.getLogger(__name__)

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "vocab.json",
)
# README.md: the source's model card, whose license and language the output's card carries
HUB_PATTERNS = ["*.safetensors", INDEX_NAME, "config.json", "README.md", *TOKENIZER_FILES]
BUILTIN_PREFIX = "builtin:"
_CONFIG_HINT = "config.json should be the release's own; download it again"

# names used by some ports for the same facts
_KEY_VARIANTS = {
    "n_vq": ("n_vq", "n_codebooks"),
    "audio_vocab_size": ("audio_vocab_size", "codebook_size"),
    "audio_pad_code": ("audio_pad_code", "codebook_pad_token_id"),
}


@dataclass(frozen=True)
class MossConfig:
    """The facts of a MOSS delay model that every step needs."""

    n_vq: int
    audio_vocab_size: int
    audio_pad_code: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    sampling_rate: int
    pad_token_id: int
    im_start_token_id: int
    im_end_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int
    audio_user_slot_token_id: int
    audio_assistant_gen_slot_token_id: int
    audio_assistant_delay_slot_token_id: int
    model_type: str = "moss_tts_delay"
    variant: str = "MOSS-TTS"

    @property
    def audio_rows(self) -> int:
        """Rows of each audio table and head: the codebook plus its pad row."""
        return self.audio_vocab_size + 1

    @classmethod
    def from_dict(cls, config: dict[str, Any], path: Path | None = None) -> MossConfig:
        lang = config.get("language_config")
        if not isinstance(lang, dict):
            raise InputError("config has no 'language_config' section", path=path)

        def pick(name: str, default: Any = None) -> Any:
            for key in _KEY_VARIANTS.get(name, (name,)):
                if config.get(key) is not None:
                    return config[key]
            return default

        def need(section: dict, key: str, where: str) -> Any:
            if section.get(key) is None:
                raise InputError(f"config is missing {where}{key}", path=path)
            return section[key]

        v = ConfigValues(path or Path("config.json"), "MOSS-TTS", _CONFIG_HINT)

        def count(section: dict, key: str, where: str, most: int, default: Any = None) -> int:
            value = section.get(key)
            if value is None and default is None:
                value = need(section, key, where)
            return v.positive(default if value is None else value, where + key, most)

        hidden = count(lang, "hidden_size", "language_config.", MOST_WIDTH)
        heads = count(lang, "num_attention_heads", "language_config.", MOST_WIDTH)
        kv_heads = count(lang, "num_key_value_heads", "language_config.", MOST_WIDTH, heads)
        if heads % kv_heads:  # llama.cpp's grouped attention asserts it
            raise InputError(f"config's language_config.num_attention_heads {heads} is not a "
                             f"multiple of num_key_value_heads {kv_heads}", path=path,
                             hint=_CONFIG_HINT)  # fmt: skip
        vocab = count(lang, "vocab_size", "language_config.", MOST_ROWS)
        audio_vocab = v.positive(pick("audio_vocab_size", 1024), "audio_vocab_size", MOST_ROWS)
        return cls(
            n_vq=v.positive(pick("n_vq", 32), "n_vq", MOST_CODEBOOKS),
            audio_vocab_size=audio_vocab,
            # the pad code indexes a table of audio_vocab + 1 rows
            audio_pad_code=v.token(pick("audio_pad_code", audio_vocab), "audio_pad_code",
                                   audio_vocab + 1),  # fmt: skip
            hidden_size=hidden,
            intermediate_size=count(lang, "intermediate_size", "language_config.", MOST_ROWS),
            num_layers=count(lang, "num_hidden_layers", "language_config.", MOST_LAYERS),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=count(lang, "head_dim", "language_config.", MOST_WIDTH,
                           max(hidden // heads, 1)),  # fmt: skip
            vocab_size=vocab,
            # ggml asserts eps >= 0; a rope base of 1 or less does not rotate
            rms_norm_eps=v.real(_default(lang.get("rms_norm_eps"), 1e-6),
                                "language_config.rms_norm_eps", 0.0, 1.0),  # fmt: skip
            rope_theta=v.real(_default(lang.get("rope_theta"), 1e6),
                              "language_config.rope_theta", 1.0, 1e12),  # fmt: skip
            max_position_embeddings=count(lang, "max_position_embeddings", "language_config.",
                                          MOST_ROWS, 40960),  # fmt: skip
            sampling_rate=v.positive(_default(config.get("sampling_rate"), 24000),
                                     "sampling_rate", 1_000_000),  # fmt: skip
            model_type=str(config.get("model_type", "moss_tts_delay")),
            variant=variant_name(config),
            **{k: v.token(_default(config.get(k), d), k, vocab) for k, d in TOKEN_DEFAULTS.items()},
        )


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def variant_name(config: dict[str, Any]) -> str:
    name = str(config.get("_name_or_path") or config.get("name_or_path") or "")
    n_vq = config.get("n_vq", config.get("n_codebooks", 32))
    if "ttsd" in name.lower() or n_vq == 16:
        return "MOSS-TTSD"
    if config.get("gen_token_id") is not None or "voice" in name.lower():
        return "MOSS-VoiceGenerator"
    if "soundeffect" in name.lower().replace("-", "").replace("_", ""):
        return "MOSS-SoundEffect"
    return "MOSS-TTS"


@dataclass(frozen=True)
class TensorRef:
    """One tensor of the checkpoint, read lazily from its shard."""

    name: str
    path: Path
    info: TensorInfo
    # a merged LoRA update (source/lora.TensorDelta): every reader adds its rows
    delta: RowDelta | None = field(default=None, compare=False)

    @property
    def dtype(self) -> str:
        return self.info.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def nbytes(self) -> int:
        return self.info.nbytes

    @property
    def offset(self) -> int:
        return self.info.offset

    def array(self) -> np.ndarray:
        """Memory-mapped, in storage dtype (bf16 as uint16)."""
        return self.info.memmap(self.path)

    def read_f32(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) widened to float32."""
        rows = self.array()[start:stop]
        if self.delta is not None:
            return self.delta.merged(rows, self.dtype, start)
        return to_f32(np.asarray(rows), self.dtype)


@dataclass
class MossCheckpoint:
    root: Path
    config: dict[str, Any]
    moss: MossConfig
    tensors: dict[str, TensorRef]
    shards: list[Path]
    tokenizer_files: list[Path] = field(default_factory=list)

    @property
    def language_config(self) -> dict[str, Any]:
        return self.config["language_config"]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def backbone_tensors(self) -> list[tuple[str, TensorRef]]:
        """(Qwen3ForCausalLM name, source tensor) for the standalone backbone, in source order."""
        out = []
        for name, ref in self.tensors.items():
            if name.startswith("language_model."):
                out.append(("model." + name[len("language_model.") :], ref))
        out.append(("lm_head.weight", self.tensors["lm_heads.0.weight"]))
        return out


def folder_config(root: Path) -> dict[str, Any] | None:
    """A folder's config.json as read (bounded, confined to the folder), or None where there is
    none or it is not an object: what a family asks to tell whether a folder is its."""
    path = Path(root) / "config.json"
    if not present(path):
        return None
    config = read_json(confined(path, boundary(Path(root))), "config.json")
    return config if isinstance(config, dict) else None


def read_json(path: Path, what: str) -> Any:
    if not present(path):
        raise InputError(f"{what} not found", path=path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{what} not found", path=path) from exc
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(
            f"{what} is not valid JSON ({exc})",
            path=path,
            hint="the file is truncated or corrupt; download it again",
        ) from exc


# model_type values of OpenMOSS checkpoints that are not delay models
_REFUSED_TYPES = {
    "moss_tts_local": "MOSS-TTS-Local",
    "moss_ttsd": "MOSS-TTSD v0.5/v0.7",
    "asteroid": "MOSS-TTSD v0.5/v0.7",
    "moss_soundeffect": "MOSS-SoundEffect v2.0",
}
_ONLY_DELAY = "only MOSS delay models convert to a llama.cpp backbone"
# MOSS-TTS-Realtime: its own family (realtime/, registered in families/); `all` routes it there,
# the delay family's own commands (extract, convert) refuse it
_REALTIME_ROUTE = "`all` converts it into a Realtime folder (docs/realtime.md)"
_REALTIME_BUILTIN = "builtin:tiny-realtime"


def detect_lookalike(config: dict[str, Any], path: Path) -> None:
    """Refuse, with the likely model name, what is not a MOSS delay model."""
    model_type = str(config.get("model_type", ""))
    listed = config.get("architectures")
    archs = [str(a)[:80] for a in listed] if isinstance(listed, list) else []
    if model_type == "moss_tts_nano":  # its own family (nano/): `all` routes it there
        raise UnsupportedModelError(
            "MOSS-TTS-Nano (model_type 'moss_tts_nano') is not a MOSS delay model; `all` "
            "converts it into a Nano folder (docs/nano.md)",
            path=path,
            hint="run: moss-gguf all --model FOLDER --output DIR",
        )
    if model_type == "moss_tts_realtime" or "MossTTSRealtime" in archs:
        raise UnsupportedModelError(
            f"MOSS-TTS-Realtime (model_type {model_type or 'missing'!r}) is not a MOSS delay "
            f"model; {_REALTIME_ROUTE}",
            path=path,
            hint="run: moss-gguf all --model FOLDER --output DIR",
        )
    if model_type in _REFUSED_TYPES:
        raise UnsupportedModelError(
            f"{_REFUSED_TYPES[model_type]} (model_type {model_type!r}) is not a MOSS delay model",
            path=path,
            hint=_ONLY_DELAY,
        )
    if "language_config" not in config:
        if model_type in ("qwen3", "qwen2") or any("Qwen" in a for a in archs):
            raise UnsupportedModelError(
                f"this is a plain {model_type or archs[0]} checkpoint, not MOSS-TTS",
                path=path,
                hint="convert it with llama.cpp's convert_hf_to_gguf.py directly",
            )
        raise UnsupportedModelError(
            f"not a MOSS-TTS config (model_type {model_type or 'missing'!r}, no language_config)",
            path=path,
            hint="point --model at a MOSS-TTS checkpoint folder",
        )
    if config.get("local_num_layers") is not None or config.get("local_hidden_size") is not None:
        raise UnsupportedModelError(
            "MOSS-TTS-Local-Transformer (local_num_layers/local_hidden_size) is not a delay model",
            path=path,
            hint=_ONLY_DELAY,
        )
    if model_type and model_type != "moss_tts_delay":
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not a MOSS delay model (expected 'moss_tts_delay')",
            path=path,
            hint=_ONLY_DELAY,
        )


def _shard_files(root: Path) -> tuple[list[Path], dict[str, Path] | None]:
    index = root / INDEX_NAME
    if present(index):
        data = read_json(index, "safetensors index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(
                "index has no 'weight_map'",
                path=index,
                hint="the file is truncated or corrupt; download it again",
            )
        by_tensor: dict[str, Path] = {}
        for tensor, rel in weight_map.items():
            if not isinstance(rel, str):
                raise InputError(f"index maps {tensor!r} to a non-string", path=index)
            by_tensor[tensor] = child(root, rel, "shard", index)
        shards = list(dict.fromkeys(by_tensor.values()))
        for shard in shards:
            if not present(shard):
                raise InputError(
                    f"shard {shard.name} named by the index is missing",
                    path=index,
                    hint="download the missing shard again",
                )
        return shards, by_tensor
    single = root / SINGLE_NAME
    if present(single):
        return [single], None
    pickles = sorted(p.name for p in root.glob("*.bin")) + sorted(p.name for p in root.glob("*.pt"))
    if pickles:
        raise InputError(
            f"only pickled weights ({', '.join(pickles[:3])}) found; they are never "
            "loaded, since unpickling can run arbitrary code",
            path=root,
            hint="use the model's safetensors files",
        )
    raise InputError(
        "no model.safetensors or model.safetensors.index.json",
        path=root,
        hint="point --model at a MOSS-TTS checkpoint folder",
    )


def open_checkpoint(root: Path) -> MossCheckpoint:
    """Read config, index and shard headers, and check the tensor set against the config."""
    root = Path(root)
    if not root.is_dir():
        raise InputError("model folder not found", path=root)
    config_path = root / "config.json"
    if (root / "model_index.json").is_file():
        raise UnsupportedModelError(
            "model_index.json marks a diffusion pipeline (such as MOSS-SoundEffect v2.0), "
            "not a MOSS delay model",
            path=root,
            hint=_ONLY_DELAY,
        )
    if not present(config_path):
        raise InputError(
            "config.json is missing",
            path=root,
            hint="point --model at a MOSS-TTS checkpoint folder",
        )
    edge = boundary(root)
    config = read_json(confined(config_path, edge), "config.json")
    if not isinstance(config, dict):
        raise InputError("config.json is not a JSON object", path=config_path)
    detect_lookalike(config, config_path)
    moss = MossConfig.from_dict(config, config_path)

    shards, tensors = read_tensors(root)
    _check_tensors(tensors, moss, config_path)
    tokenizer = [confined(root / n, edge) for n in TOKENIZER_FILES if present(root / n)]
    return MossCheckpoint(root, config, moss, tensors, shards, tokenizer)


def read_tensors(root: Path) -> tuple[list[Path], dict[str, TensorRef]]:
    """The shards of a safetensors folder (index + shards, or one file) and every tensor in them."""
    edge = boundary(root)
    if present(root / INDEX_NAME):
        confined(root / INDEX_NAME, edge)
    shards, by_tensor = _shard_files(root)
    for shard in shards:  # before a header is read: a link out is never opened
        confined(shard, edge)
    tensors: dict[str, TensorRef] = {}
    for shard in shards:
        for name, info in read_header(shard).tensors.items():
            if by_tensor is not None and by_tensor.get(name) != shard:
                continue  # the index is authoritative about where a tensor lives
            tensors[name] = TensorRef(name, shard, info)
    if by_tensor is not None:
        missing = [n for n in by_tensor if n not in tensors]
        if missing:
            raise InputError(
                f"tensor {missing[0]!r} listed in the index is not in its shard "
                f"({len(missing)} missing)",
                path=root / INDEX_NAME,
                hint="the shard is corrupt or from another model; download it again",
            )
    return shards, tensors


def expected_shapes(moss: MossConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of the MOSS-specific tensors and the backbone ends."""
    h = moss.hidden_size
    shapes = {
        "language_model.embed_tokens.weight": (moss.vocab_size, h),
        "language_model.norm.weight": (h,),
        "lm_heads.0.weight": (moss.vocab_size, h),
    }
    for i in range(moss.n_vq):
        shapes[f"emb_ext.{i}.weight"] = (moss.audio_rows, h)
        shapes[f"lm_heads.{i + 1}.weight"] = (moss.audio_rows, h)
    q = moss.num_heads * moss.head_dim
    kv = moss.num_kv_heads * moss.head_dim
    f = moss.intermediate_size
    for n in range(moss.num_layers):
        shapes.update(layer_shapes(f"language_model.layers.{n}.", h, q, kv, f, moss.head_dim))
    return shapes


def _check_tensors(tensors: dict[str, TensorRef], moss: MossConfig, config_path: Path) -> None:
    if any(n.startswith(("model.embedding_list.", "local_transformer.")) for n in tensors):
        raise UnsupportedModelError(
            "tensors model.embedding_list.*/local_transformer.* mark MOSS-TTS-Local-Transformer, "
            "not a delay model",
            path=config_path.parent,
            hint=_ONLY_DELAY,
        )
    _counts_agree(tensors, moss, config_path)
    expected = expected_shapes(moss)
    for name, shape in expected.items():
        ref = tensors.get(name)
        if ref is None:
            raise InputError(
                f"tensor {name!r} is missing",
                path=config_path.parent,
                hint="the checkpoint is incomplete or not a MOSS-TTS delay model",
            )
        if tuple(ref.shape) != shape:
            raise InputError(
                f"tensor {name!r} has shape {list(ref.shape)} but the config implies {list(shape)}",
                path=ref.path,
                hint="config.json and the weights disagree; re-download both",
            )
    _plain_dtypes([tensors[name] for name in expected])


def _counts_agree(tensors: dict[str, TensorRef], moss: MossConfig, config_path: Path) -> None:
    """The config's layer and codebook counts are the weights' (a count the weights do not
    bear out is named here, before a name or shape is built from it)."""
    counts_agree((("language_config.num_hidden_layers", moss.num_layers, "language_model.layers.",
                   "layers"), ("n_vq", moss.n_vq, "emb_ext.", "audio tables")),
                 tensors, config_path, "config.json and the weights disagree")  # fmt: skip


# what a weight may be stored as: the GGUF writers widen these exactly; an integer, bool or
# float64 tensor where a weight belongs is another model's (or a broken export's)
WEIGHT_DTYPES = ("F32", "F16", "BF16")


def _plain_dtypes(weights: list[TensorRef]) -> None:
    odd = [ref for ref in weights if ref.dtype not in WEIGHT_DTYPES]
    if odd:
        more = f" (and {len(odd) - 1} more tensors)" if len(odd) > 1 else ""
        raise InputError(f"tensor {odd[0].name!r} is stored as {odd[0].dtype}{more}; MOSS-TTS "
                         "weights are F32, F16 or BF16", path=odd[0].path,
                         hint="the weights are of another model or a broken export")  # fmt: skip


# ----------------------------------------------------------------------------- where it is


def resolve_model(
    model: str,
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> Path:
    """A local folder for MODEL: itself, the builtin tiny checkpoint, or a Hub snapshot."""
    if model == _REALTIME_BUILTIN:
        raise UnsupportedModelError(f"{model} is MOSS-TTS-Realtime; {_REALTIME_ROUTE}",
                                    hint=f"run: moss-gguf all --model {model} --output DIR")
    if model.startswith(BUILTIN_PREFIX):
        from .tiny import ensure_tiny

        return ensure_tiny(model[len(BUILTIN_PREFIX) :])
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError("expected a checkpoint folder, got a file", path=path)
        return path
    if not is_repo_id(model):
        raise InputError(
            "model folder not found",
            path=path,
            hint="give an existing folder, a Hub repo id like OpenMOSS-Team/MOSS-TTS,"
            " or builtin:tiny",
        )
    refuse_lookalike_repo(model)  # before gigabytes of someone else's weights are fetched
    return download(model, HUB_PATTERNS, revision, cache_dir, progress)


# Hub repos known by name not to be delay models, refused before their download (their
# config would refuse them after it): the repo's name, lower case, starts with the key
_HUB_LOOKALIKES = {
    "moss-tts-realtime": f"MOSS-TTS-Realtime; {_REALTIME_ROUTE}",
    "moss-tts-local-transformer": "MOSS-TTS-Local-Transformer, which is not a MOSS delay "
    "model; a coming version converts it (--format openmoss / crispasr)",
}


def refuse_lookalike_repo(model: str) -> None:
    """One line for a --model that is a Hub id of a known look-alike, before anything of it
    is listed or fetched (a local folder or builtin is left to its config)."""
    if model.startswith(BUILTIN_PREFIX) or Path(model).expanduser().exists() \
            or not is_repo_id(model):  # fmt: skip
        return
    name = model.split("/")[-1].lower()
    for prefix, said in _HUB_LOOKALIKES.items():
        if name.startswith(prefix):
            raise UnsupportedModelError(f"{model} is {said}", hint=_ONLY_DELAY)




def as_checkpoint(source: Path | str | MossCheckpoint) -> MossCheckpoint:
    """SOURCE opened: a checkpoint already opened (`all` opens it once per run) as it is,
    a folder opened here."""
    return source if isinstance(source, MossCheckpoint) else open_checkpoint(Path(source))
