"""The PyTorch MOSS Audio Tokenizer checkpoint (OpenMOSS-Team/MOSS-Audio-Tokenizer).

The codec that turns audio codes into 24 kHz audio, as its Hugging Face repo stores it:
``config.json`` (``encoder_kwargs`` / ``decoder_kwargs``: lists of ``Transformer`` and
``PatchedPretransform`` modules; ``quantizer_kwargs``: a residual LFQ of ``num_quantizers``
quantizers) and safetensors weights, sharded with an index or as one ``model.safetensors``.
The tensor names are those of upstream's ``modeling_moss_audio_tokenizer.py``: per Transformer
module ``{section}.{i}.input_proj.weight`` (only when d_model differs from the input),
``{section}.{i}.transformer.layers.{l}.*`` and ``{section}.{i}.output_proj.weight``; the
quantizer's 1×1 convolutions are weight-normed (``parametrizations.weight.original0/1``, g and v).

Opening reads the config and the safetensors headers only, and checks every tensor the config
implies against them, so a wrong input is named before any GGUF is started. The order of the
tensors is the one OpenMOSS's converter walks (the index's ``weight_map`` order; for one file,
the names sorted, which is the order transformers writes an index in): the GGUF's tensor order
follows from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..disk.confine import boundary, confined
from ..errors import InputError, UnsupportedModelError
from .checkpoint import INDEX_NAME, TensorRef, read_json, read_tensors

MODULE_TYPES = ("Transformer", "PatchedPretransform")
QUANTIZER_TYPES = ("rlfq",)  # what OpenMOSS's converter and loader know
ARCHITECTURE = "MossAudioTokenizerModel"
SECTIONS = ("encoder", "decoder")
_HINT = "point it at a MOSS-Audio-Tokenizer checkpoint (OpenMOSS-Team/MOSS-Audio-Tokenizer)"


@dataclass(frozen=True)
class CodecCheckpoint:
    """A checked MOSS Audio Tokenizer checkpoint: its config and its tensors in reading order."""

    root: Path
    name: str  # the folder's name, or the Hub repo's name
    config: dict[str, Any]
    tensors: dict[str, TensorRef]  # in the order the fork's converter walks them
    shards: list[Path]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _modules(config: dict[str, Any], section: str, path: Path) -> list[dict[str, Any]]:
    modules = config.get(f"{section}_kwargs")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise InputError(f"config has no {section}_kwargs module list", path=path, hint=_HINT)
    return modules


def check_config(config: dict[str, Any], path: Path) -> None:
    """Refuse what is not a MOSS Audio Tokenizer, or one the fork's converter cannot write."""
    archs = [str(a) for a in config.get("architectures") or []]
    keys = ("encoder_kwargs", "decoder_kwargs", "quantizer_kwargs")
    if ARCHITECTURE not in archs and not all(k in config for k in keys):
        what = archs[0] if archs else repr(config.get("model_type", "no model_type"))
        raise UnsupportedModelError(
            f"not a MOSS Audio Tokenizer config ({what}; no encoder_kwargs/decoder_kwargs/"
            "quantizer_kwargs)",
            path=path,
            hint=_HINT,
        )
    q = config.get("quantizer_kwargs")
    if not isinstance(q, dict):
        raise InputError("config has no quantizer_kwargs", path=path, hint=_HINT)
    kind = config.get("quantizer_type") or q.get("quantizer_type")
    if kind not in QUANTIZER_TYPES:
        raise UnsupportedModelError(
            f"quantizer_type {kind!r} is not one the fork's converter writes (rlfq)", path=path
        )
    for key in ("input_dim", "num_quantizers", "codebook_size", "codebook_dim"):
        if not isinstance(q.get(key), int):
            raise InputError(f"config's quantizer_kwargs has no integer {key}", path=path)
    for section in SECTIONS:
        for i, module in enumerate(_modules(config, section, path)):
            _check_module(module, f"{section}_kwargs[{i}]", path)


def _check_module(module: dict[str, Any], where: str, path: Path) -> None:
    kind = module.get("module_type")
    if kind not in MODULE_TYPES:
        raise UnsupportedModelError(
            f"{where}.module_type {kind!r} is not a module type the fork knows "
            f"({', '.join(MODULE_TYPES)})",
            path=path,
        )
    if kind == "PatchedPretransform":
        if not isinstance(module.get("patch_size"), int) or module["patch_size"] < 1:
            raise InputError(f"{where} has no positive integer patch_size", path=path)
        return
    for key in ("input_dimension", "output_dimension", "d_model", "num_heads", "num_layers"):
        if not isinstance(module.get(key), int):
            raise InputError(f"{where} has no integer {key}", path=path)
    fixed = {"gating": "none", "positional_embedding": "rope", "norm": "layer_norm"}
    for key, want in fixed.items():
        if module.get(key, want) != want:
            raise UnsupportedModelError(
                f"{where}.{key} is {module[key]!r}; the fork's converter and loader take {want!r}",
                path=path,
            )
    if module.get("weights_per_step") or module.get("weights_per_step_schedule"):
        raise UnsupportedModelError(
            f"{where} has weights_per_step, which the fork refuses", path=path
        )
    for key, value in module.items():
        if not isinstance(value, (str, bool, int, float)):
            raise UnsupportedModelError(
                f"{where}.{key} is {value!r}; the fork's converter writes only numbers, "
                "booleans and strings",
                path=path,
            )


def _transformer_shapes(prefix: str, m: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    d, n_in, n_out = m["d_model"], m["input_dimension"], m["output_dimension"]
    ff = int(m.get("dim_feedforward", 2048))  # upstream's default
    out: dict[str, tuple[int, ...]] = {}
    if d != n_in:
        out[f"{prefix}.input_proj.weight"] = (d, n_in)
    for layer in range(m["num_layers"]):
        p = f"{prefix}.transformer.layers.{layer}"
        out[f"{p}.self_attn.in_projs.0.weight"] = (3 * d, d)
        out[f"{p}.self_attn.out_projs.0.weight"] = (d, d)
        for norm in ("norm1", "norm2"):
            out[f"{p}.{norm}.weight"] = (d,)
            out[f"{p}.{norm}.bias"] = (d,)
        out[f"{p}.linear1.weight"] = (ff, d)
        out[f"{p}.linear2.weight"] = (d, ff)
        if m.get("layer_scale") is not None:
            out[f"{p}.layer_scale_1.scale"] = (d,)
            out[f"{p}.layer_scale_2.scale"] = (d,)
    if d != n_out:
        out[f"{prefix}.output_proj.weight"] = (n_out, d)
    return out


def _conv(prefix: str, n_out: int, n_in: int) -> dict[str, tuple[int, ...]]:
    """A weight-normed 1×1 Conv1d: bias, g and v."""
    return {
        f"{prefix}.bias": (n_out,),
        f"{prefix}.parametrizations.weight.original0": (n_out, 1, 1),
        f"{prefix}.parametrizations.weight.original1": (n_out, n_in, 1),
    }


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor name the config implies → its shape (upstream's module structure)."""
    out: dict[str, tuple[int, ...]] = {}
    for section in SECTIONS:
        for i, module in enumerate(config[f"{section}_kwargs"]):
            if module["module_type"] == "Transformer":
                out.update(_transformer_shapes(f"{section}.{i}", module))
    q = config["quantizer_kwargs"]
    dim = q["input_dim"]
    rvq = q.get("rvq_dim") or dim
    out_dim = q.get("output_dim") or dim
    if dim != rvq:
        out.update(_conv("quantizer.input_proj", rvq, dim))
    if rvq != out_dim:
        out.update(_conv("quantizer.output_proj", out_dim, rvq))
    for n in range(q["num_quantizers"]):
        p = f"quantizer.quantizers.{n}"
        out.update(_conv(f"{p}.in_proj", q["codebook_dim"], rvq))
        out.update(_conv(f"{p}.out_proj", rvq, q["codebook_dim"]))
        out[f"{p}.codebook.weight"] = (q["codebook_size"], q["codebook_dim"])
    return out


def _reading_order(root: Path, tensors: dict[str, TensorRef]) -> dict[str, TensorRef]:
    index = root / INDEX_NAME
    if index.exists():
        names = list(read_json(index, "safetensors index")["weight_map"])
    else:
        names = sorted(tensors)
    return {n: tensors[n] for n in names}


def open_codec_checkpoint(root: Path, name: str | None = None) -> CodecCheckpoint:
    """Read and check a MOSS Audio Tokenizer folder; no tensor data is read."""
    root = Path(root)
    if not root.is_dir():
        raise InputError("audio tokenizer checkpoint folder not found", path=root, hint=_HINT)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise InputError("config.json is missing", path=root, hint=_HINT)
    config = read_json(confined(config_path, boundary(root)), "config.json")
    if not isinstance(config, dict):
        raise InputError("config.json is not a JSON object", path=config_path)
    check_config(config, config_path)
    shards, tensors = read_tensors(root)
    tensors = _reading_order(root, tensors)
    for tensor, shape in expected_shapes(config).items():
        ref = tensors.get(tensor)
        if ref is None:
            raise InputError(
                f"tensor {tensor} is missing",
                path=root,
                hint="the checkpoint is incomplete or does not match its config.json",
            )
        if ref.shape != shape:
            raise InputError(
                f"tensor {tensor} has shape {list(ref.shape)}; config.json makes it {list(shape)}",
                path=ref.path,
                hint="the weights do not match their config.json",
            )
        if ref.dtype not in ("F32", "F16", "BF16", "F64"):
            raise InputError(f"tensor {tensor} is {ref.dtype}, not a float", path=ref.path)
    return CodecCheckpoint(root, name or root.resolve().name, config, tensors, shards)
