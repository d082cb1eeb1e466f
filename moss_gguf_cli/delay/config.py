"""Settings of `synth`: the synth YAML (docs/ARCHITECTURE.md §5) and the model facts beside it.

`SynthConfig.from_yaml(path)` reads the file the `layout`/`all` commands write, and also
upstream's ``configs/llama_cpp/*.yaml`` files unchanged. Relative paths resolve as upstream
resolves them: against the project root (the nearest folder above the YAML holding a
pyproject.toml), then the YAML's folder, then the working directory; the first that exists.
Unknown keys are a logged warning; a value of the wrong type is a UsageError naming the key.
`ModelInfo` holds n_vq and the special token ids, read from the extraction meta / MOSS config
next to the tables; the defaults of docs/ARCHITECTURE.md §2 apply only when absent.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..disk.layout_names import FAMILY_KEY
from ..errors import InputError, UnsupportedModelError, UsageError
from ..gguf.first_class import FORMAT as DELAY_FAMILY  # the delay family's name
from ..source.checkpoint import variant_name
from ..source.token_ids import TOKEN_DEFAULTS
from ..tts.codec import SAMPLE_RATE
from ..tts.defaults import SYNTH_DEFAULTS as D
from ..tts.lora import LoraSpec

log = logging.getLogger(__name__)

PATH_KEYS = (
    "backbone_gguf",
    "embedding_dir",
    "lm_head_dir",
    "tokenizer_dir",
    "audio_encoder_onnx",
    "audio_decoder_onnx",
    "model_config",
)
REQUIRED_KEYS = ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir")
INT_KEYS = (
    "n_ctx",
    "n_batch",
    "n_threads",
    "n_gpu_layers",
    "max_new_tokens",
    "text_top_k",
    "audio_top_k",
)
FLOAT_KEYS = (
    "text_temperature",
    "text_top_p",
    "audio_temperature",
    "audio_top_p",
    "audio_repetition_penalty",
)
STR_KEYS = ("audio_backend", "heads_backend", "kv_cache_type_k", "kv_cache_type_v")
BOOL_KEYS = ("use_gpu_audio", "low_memory", "profile")
# upstream keys we read without using (other backends); no warning for them
KNOWN_UPSTREAM_KEYS = frozenset(
    {"audio_encoder_trt", "audio_decoder_trt", "audio_tokenizer_dir", "audio_tokenizer_path"}
)

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
FLASH_ATTN = ("auto", "enabled", "disabled")
# numpy, torch: float32 heads (upstream's numerics); auto, ggml-f16: float16 through ggml
HEADS_BACKENDS = ("auto", "numpy", "torch", "ggml-f16", "ggml")

# docs/ARCHITECTURE.md §2 defaults, used only when no config beside the tables says otherwise
DEFAULT_TOKENS = TOKEN_DEFAULTS


@dataclass
class SynthConfig:
    """Everything `synth` needs, paths already absolute."""

    backbone_gguf: Path
    embedding_dir: Path
    lm_head_dir: Path
    tokenizer_dir: Path
    audio_decoder_onnx: Path | None = None
    audio_encoder_onnx: Path | None = None
    model_config: Path | None = None  # extraction_meta.json or the MOSS config.json
    # defaults: tts.defaults.SYNTH_DEFAULTS, the values layout writes (upstream's)
    audio_backend: str = D["audio_backend"]
    heads_backend: str = D["heads_backend"]
    n_ctx: int = D["n_ctx"]
    n_batch: int = D["n_batch"]
    n_threads: int = D["n_threads"]  # 0: the physical cores
    n_gpu_layers: int = D["n_gpu_layers"]
    max_new_tokens: int = D["max_new_tokens"]
    use_gpu_audio: bool = D["use_gpu_audio"]
    kv_cache_type_k: str = D["kv_cache_type_k"]
    kv_cache_type_v: str = D["kv_cache_type_v"]
    flash_attn: str = D["flash_attn"]
    text_temperature: float = D["text_temperature"]
    text_top_p: float = D["text_top_p"]
    text_top_k: int = D["text_top_k"]
    audio_temperature: float = D["audio_temperature"]
    audio_top_p: float = D["audio_top_p"]
    audio_top_k: int = D["audio_top_k"]
    audio_repetition_penalty: float = D["audio_repetition_penalty"]
    low_memory: bool = False  # upstream's: load stage by stage (see validate)
    profile: bool = False  # upstream's: print where the time went, as --profile
    source: Path | None = field(default=None, compare=False)
    # LoRA adapter GGUFs llama.cpp applies at run time (synth/serve --lora; not a YAML key)
    lora: tuple[LoraSpec, ...] = ()

    @classmethod
    def from_yaml(cls, path: str | Path) -> SynthConfig:
        import yaml

        path = Path(path).expanduser()
        if not path.is_file():
            raise InputError(
                "config file not found", path=path, hint="pass the moss-tts.yaml `layout` wrote"
            )
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(f"cannot read the config YAML: {first}", path=path) from exc
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise InputError("the config YAML is not a mapping of keys to values", path=path)
        return cls.from_dict(data, base=path.resolve().parent, source=path)

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], base: Path | None = None, source: Path | None = None
    ) -> SynthConfig:
        if data.get(FAMILY_KEY) not in (None, DELAY_FAMILY):  # another family's folder
            raise UnsupportedModelError(
                f"this is a {str(data[FAMILY_KEY])[:40]} folder's config, which the delay "
                "models' code does not read",
                path=source,
                hint="moss-gguf synth and moss-gguf serve speak it (--config)",
            )
        base = base or Path.cwd()
        names = {f.name for f in dataclasses.fields(cls)} - {"source", "lora"}
        values: dict[str, Any] = {}
        for key, value in data.items():
            key = str(key)
            if key not in names:
                if key not in KNOWN_UPSTREAM_KEYS:
                    log.warning("%s: unknown key %r ignored", source or "config", key)
                continue
            if value is None:  # an upstream file leaves optional keys empty
                continue
            values[key] = _convert(key, value, base, source)
        missing = [k for k in REQUIRED_KEYS if k not in values]
        if missing:
            raise UsageError(f"config is missing {', '.join(missing)}", path=source,
                             hint="add the key(s) with a path to the weights folder's file")
        if str(values.get("audio_backend", "onnx")).lower() == "trt":
            raise UsageError(
                "audio_backend trt: TensorRT audio engines are not supported by moss-gguf",
                path=source,
                hint="set audio_backend: onnx and audio_encoder_onnx / audio_decoder_onnx "
                "to the MOSS-Audio-Tokenizer-ONNX files",
            )
        if "audio_decoder_onnx" not in values:
            raise UsageError(
                "config is missing audio_decoder_onnx",
                path=source,
                hint="point it at the audio tokenizer's decoder.onnx",
            )
        config = cls(**values, source=source)
        config.validate()
        return config

    def override(self, **changes: Any) -> SynthConfig:
        """A copy with the given values (None means: keep the YAML's)."""
        picked = {k: v for k, v in changes.items() if v is not None}
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(picked) - names)
        if unknown:
            raise UsageError(f"unknown setting(s) {', '.join(unknown)}")
        for key, value in list(picked.items()):
            picked[key] = _convert(key, value, Path.cwd(), self.source)
        config = dataclasses.replace(self, **picked)
        config.validate()
        return config

    def validate(self) -> None:
        where = self.source

        def bad(key: str, why: str) -> UsageError:
            return UsageError(f"{key} {why}", path=where)

        if self.n_ctx < 64:
            raise bad("n_ctx", f"must be at least 64, got {self.n_ctx}")
        if self.n_batch < 1:
            raise bad("n_batch", f"must be at least 1, got {self.n_batch}")
        if self.n_threads < 0:
            raise bad("n_threads", f"must be 0 (the physical cores) or more, got {self.n_threads}")
        if self.max_new_tokens < 1:
            raise bad("max_new_tokens", f"must be at least 1, got {self.max_new_tokens}")
        for key in ("text_top_p", "audio_top_p"):
            value = getattr(self, key)
            if not 0.0 < value <= 1.0:
                raise bad(key, f"must be in (0, 1], got {value}")
        for key in ("text_top_k", "audio_top_k"):
            if getattr(self, key) < 0:
                raise bad(key, f"must be 0 (off) or more, got {getattr(self, key)}")
        if self.audio_repetition_penalty <= 0:
            raise bad("audio_repetition_penalty", "must be greater than 0")
        for key in ("kv_cache_type_k", "kv_cache_type_v"):
            if getattr(self, key) not in KV_CACHE_TYPES:
                raise bad(key, f"must be one of {', '.join(KV_CACHE_TYPES)}")
        if self.flash_attn not in FLASH_ATTN:
            raise bad("flash_attn", f"must be one of {', '.join(FLASH_ATTN)} (or true/false)")
        if self.heads_backend not in HEADS_BACKENDS:
            raise bad("heads_backend", f"must be one of {', '.join(HEADS_BACKENDS)}")
        if self.low_memory:
            log.info(
                "%s: low_memory changes nothing here: the tables are memory-mapped (read "
                "as used) and the codec sessions are small next to the backbone",
                where or "config",
            )
        if self.audio_backend != "onnx":
            log.warning(
                "%s: audio_backend %r is not supported here; using the ONNX files",
                where or "config",
                self.audio_backend,
            )

    def check_files(self, need_encoder: bool = False) -> None:
        """Every file the config points at exists (InputError naming the key otherwise)."""
        wanted: list[tuple[str, Path | None, bool]] = [
            ("backbone_gguf", self.backbone_gguf, False),
            ("embedding_dir", self.embedding_dir, True),
            ("lm_head_dir", self.lm_head_dir, True),
            ("tokenizer_dir", self.tokenizer_dir, True),
            ("audio_decoder_onnx", self.audio_decoder_onnx, False),
        ]
        if need_encoder:
            wanted.append(("audio_encoder_onnx", self.audio_encoder_onnx, False))
        for key, path, is_dir in wanted:
            if path is None:
                raise UsageError(f"config has no {key}", path=self.source, hint=f"set {key}")
            ok = path.is_dir() if is_dir else path.is_file()
            if not ok:
                kind = "folder" if is_dir else "file"
                raise InputError(
                    f"{key} points at a missing {kind}",
                    path=path,
                    hint=f"fix {key} in {self.source or 'the config'} (relative to its folder)",
                )
        if not (self.tokenizer_dir / "tokenizer.json").is_file():
            raise InputError(
                "tokenizer_dir has no tokenizer.json",
                path=self.tokenizer_dir,
                hint="copy the tokenizer files of the checkpoint there",
            )


def _convert(key: str, value: Any, base: Path, source: Path | None) -> Any:
    def wrong(expected: str) -> UsageError:
        return UsageError(
            f"config key {key} must be {expected}, got {type(value).__name__} {value!r}",
            path=source,
        )

    if key in PATH_KEYS:
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise wrong("a path")
        return _resolve(Path(str(value)).expanduser(), base)
    if key in INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        return value
    if key in FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        return float(value)
    if key in BOOL_KEYS:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if key in STR_KEYS:
        if not isinstance(value, str):
            raise wrong("a string")
        return value.strip().lower()
    if key == "flash_attn":
        if isinstance(value, bool):
            return "enabled" if value else "disabled"
        if isinstance(value, str):
            word = value.strip().lower()
            aliases = {"on": "enabled", "true": "enabled", "off": "disabled", "false": "disabled"}
            return aliases.get(word, word)
        raise wrong("auto, enabled or disabled")
    return value


def project_root(folder: Path) -> Path | None:
    """The nearest of FOLDER and its parents that holds a pyproject.toml (upstream's root)."""
    for candidate in (folder, *folder.parents):
        if (candidate / "pyproject.toml").is_file():
            return candidate
    return None


def _resolve(path: Path, base: Path) -> Path:
    """Upstream's order: the project root, the YAML's folder, the working directory.

    The first that exists wins; when none does, the first candidate (so the error names it).
    """
    if path.is_absolute():
        return path
    root = project_root(base)
    candidates = [root / path] if root is not None else []
    candidates += [base / path, Path.cwd() / path]
    for c in candidates:
        if c.exists():
            return c.resolve()
    return candidates[0].resolve()


# ---------------------------------------------------------------- model facts


@dataclass(frozen=True)
class ModelInfo:
    """n_vq, codebook size and special token ids of the MOSS model behind the tables."""

    n_vq: int = 32
    audio_vocab_size: int = 1024
    audio_pad_code: int = 1024
    sampling_rate: int = 24000
    pad_token_id: int = DEFAULT_TOKENS["pad_token_id"]
    im_start_token_id: int = DEFAULT_TOKENS["im_start_token_id"]
    im_end_token_id: int = DEFAULT_TOKENS["im_end_token_id"]
    audio_start_token_id: int = DEFAULT_TOKENS["audio_start_token_id"]
    audio_end_token_id: int = DEFAULT_TOKENS["audio_end_token_id"]
    audio_user_slot_token_id: int = DEFAULT_TOKENS["audio_user_slot_token_id"]
    audio_assistant_gen_slot_token_id: int = DEFAULT_TOKENS["audio_assistant_gen_slot_token_id"]
    audio_assistant_delay_slot_token_id: int = DEFAULT_TOKENS["audio_assistant_delay_slot_token_id"]
    variant: str = "MOSS-TTS"
    source: Path | None = None

    @property
    def audio_rows(self) -> int:
        return self.audio_vocab_size + 1

    @classmethod
    def from_moss_config(cls, config: dict[str, Any], source: Path | None = None) -> ModelInfo:
        def number(key: str, default: int) -> int:
            value = config.get(key, default)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{key} must be an integer, got {value!r}", path=source)
            return value

        audio_vocab = number("audio_vocab_size", 1024)
        return cls(
            n_vq=number("n_vq", 32),
            audio_vocab_size=audio_vocab,
            audio_pad_code=number("audio_pad_code", audio_vocab),
            sampling_rate=number("sampling_rate", 24000),
            variant=variant_name(config),
            source=source,
            **{k: number(k, v) for k, v in DEFAULT_TOKENS.items()},
        )

    def refuse_unsupported(self) -> None:
        if self.sampling_rate != SAMPLE_RATE:
            raise UnsupportedModelError(
                f"the model speaks at {self.sampling_rate} Hz; the ONNX audio tokenizer synth "
                f"runs is {SAMPLE_RATE} Hz",
                path=self.source,
                hint="this variant's own tokenizer has no ONNX export",
            )


def find_model_info(config: SynthConfig) -> ModelInfo:
    """ModelInfo from the config's pointer, else the meta/config files near the tables."""
    candidates: list[Path] = []
    if config.model_config is not None:
        if not config.model_config.is_file():
            raise InputError(
                "model_config points at a missing file",
                path=config.model_config,
                hint="point it at extraction_meta.json or the MOSS config.json",
            )
        candidates.append(config.model_config)
    folders = []
    if config.source is not None:
        folders.append(config.source.resolve().parent)
    folders.append(config.embedding_dir.parent)
    for folder in folders:
        for name in ("extraction_meta.json", "config.json"):
            if (folder / name).is_file():
                candidates.append(folder / name)
    for path in candidates:
        moss = _moss_section(path)
        if moss is not None:
            info = ModelInfo.from_moss_config(moss, source=path)
            log.debug("model facts from %s: n_vq %d, %s", path, info.n_vq, info.variant)
            return info
    # no config: the documented defaults, n_vq from the audio tables actually present
    count = len(list(config.embedding_dir.glob("emb_ext_*.npy")))
    log.debug("no MOSS config beside %s; the documented defaults, n_vq %d", config.source, count)
    return ModelInfo(n_vq=count) if count else ModelInfo()


def _moss_section(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"cannot read model facts: {exc}", path=path) from exc
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("moss_config"), dict):  # extraction_meta.json
        moss = dict(data["moss_config"])
        source_model = data.get("source_model")
        if source_model and not moss.get("_name_or_path"):
            moss["_name_or_path"] = str(source_model)
        return moss
    if "n_vq" in data or "language_config" in data or "audio_pad_code" in data:
        return data
    return None  # a plain Qwen3 config says nothing about the audio side
