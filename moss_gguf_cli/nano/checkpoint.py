"""A MOSS-TTS-Nano folder opened: its config, its tensors, checked against each other.

The release ships `pytorch_model.bin` (read by source/torch_pickle.py: no torch, no pickle code
run); a folder with `model.safetensors` (or an index and shards) is read from those instead.
The text head is tied to `transformer.wte` and each audio head to its audio table; the .bin
holds both names over one storage, a safetensors file may hold the table alone (safetensors
refuses to store shared tensors twice), and then the head is the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..bf16 import bfloat16
from ..disk.confine import boundary, confined, present
from ..errors import InputError
from ..source.checkpoint import INDEX_NAME, SINGLE_NAME, folder_config, read_json, read_tensors
from ..source.config_values import counts_agree
from .config import NanoConfig, TransformerDims, declared_dtype, is_nano

TORCH_NAME = "pytorch_model.bin"
TOKENIZER_NAME = "tokenizer.model"
UNUSED = ("local_transformer.wte.weight",)  # in the release, never read by upstream's model
_HINT = "config.json and the weights disagree; download both again"
# the GGUF and the float32 arrays hold these exactly; ints, bools and float64 are another model's
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")  # by name: ml_dtypes loads when read


def tied_names(nano: NanoConfig) -> dict[str, str]:
    """Head → the table it is tied to."""
    tied = {"text_lm_head.weight": "transformer.wte.weight"}
    tied.update({f"audio_lm_heads.{q}.weight": f"audio_embeddings.{q}.weight"
                 for q in range(nano.n_vq)})  # fmt: skip
    return tied


def block_shapes(prefix: str, dims: TransformerDims) -> dict[str, tuple[int, ...]]:
    """One pre-LN block (upstream's gpt2_decoder: Linear weights are [out, in], all biased)."""
    h, f = dims.hidden, dims.inner
    shapes: dict[str, tuple[int, ...]] = {}
    for name, out, inp in (("attn.c_attn", 3 * h, h), ("attn.c_proj", h, h),
                           ("mlp.fc_in", f, h), ("mlp.fc_out", h, f)):  # fmt: skip
        shapes[f"{prefix}{name}.weight"] = (out, inp)
        shapes[f"{prefix}{name}.bias"] = (out,)
    for norm in ("ln_1", "ln_2"):
        shapes[f"{prefix}{norm}.weight"] = shapes[f"{prefix}{norm}.bias"] = (h,)
    return shapes


def expected_shapes(nano: NanoConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor upstream's model reads, with its shape from the config."""
    h, dims = nano.hidden, nano.dims
    shapes: dict[str, tuple[int, ...]] = {"transformer.wte.weight": (dims.vocab, h)}
    for i in range(dims.layers):
        shapes.update(block_shapes(f"transformer.h.{i}.", dims))
    shapes["transformer.ln_f.weight"] = shapes["transformer.ln_f.bias"] = (h,)
    for i in range(nano.local_layers):
        shapes.update(block_shapes(f"local_transformer.h.{i}.", dims))
    shapes["local_transformer.ln_f.weight"] = shapes["local_transformer.ln_f.bias"] = (h,)
    for q, rows in enumerate(nano.codebook_sizes):
        shapes[f"audio_embeddings.{q}.weight"] = (rows, h)
        shapes[f"audio_lm_heads.{q}.weight"] = (rows, h)
    shapes["text_lm_head.weight"] = (dims.vocab, h)
    return shapes


@dataclass
class NanoCheckpoint:
    root: Path
    config: dict[str, Any]
    nano: NanoConfig
    tensors: dict[str, np.ndarray]  # read-only; bf16 as ml_dtypes.bfloat16
    weights: Path  # the file the tensors came from (or the safetensors index)
    tokenizer: Path | None  # tokenizer.model, where the folder has it
    unused: list[str]  # tensors present that upstream's model never reads
    dtype: str = ""  # the weights' dtype as stored ("bfloat16"; mixed ones joined by "+")
    config_dtype: str | None = None  # what config.json says it is (config.declared_dtype)

    @property
    def dtype_note(self) -> str | None:
        """A line where config.json's dtype is not the stored one (the release says float32
        over bf16): the weights are read as stored, and the folder says so."""
        if self.config_dtype is None or not self.dtype or self.config_dtype == self.dtype:
            return None
        return (f"config.json says dtype {self.config_dtype} but {self.weights.name} stores "
                f"{self.dtype}; the weights are read as stored ({self.dtype})")  # fmt: skip


def is_nano_folder(root: Path) -> bool:
    """A folder whose config.json says MOSS-TTS-Nano (nothing else is read)."""
    config = folder_config(root)
    return config is not None and is_nano(config)


def _counts_agree(nano: NanoConfig, tensors: dict[str, np.ndarray], weights: Path) -> None:
    """The config's layer and codebook counts are the weights' (a count the weights do not
    bear out is named here, before anything is built from it)."""
    counts = (("gpt2_config.n_layer", nano.dims.layers, "transformer.h.", "global layers"),
              ("local_transformer_layers", nano.local_layers, "local_transformer.h.",
               "local layers"),
              ("n_vq", nano.n_vq, "audio_embeddings.", "audio tables"))  # fmt: skip
    counts_agree(counts, tensors, weights, _HINT)


def open_nano(root: Path) -> NanoCheckpoint:
    """Read and check a Nano folder: config first, then the weights (safetensors where the folder
    has them, else pytorch_model.bin), then every tensor's name and shape against the config."""
    root = Path(root)
    edge = boundary(root)
    config_path = root / "config.json"
    if not present(config_path):
        raise InputError("config.json is missing", path=root, hint="point --model at a folder")
    config = read_json(confined(config_path, edge), "config.json")
    if not isinstance(config, dict):
        raise InputError("config.json is not a JSON object", path=config_path)
    nano = NanoConfig.from_dict(config, config_path)
    weights, tensors = _read_weights(root, edge)
    _counts_agree(nano, tensors, weights)
    tied = tied_names(nano)
    for head, table in tied.items():
        if head not in tensors and table in tensors:
            tensors[head] = tensors[table]  # the table, where the file left the head out
    expected = expected_shapes(nano)
    for name, shape in expected.items():
        tensor = tensors.get(name)
        if tensor is None:
            raise InputError(f"tensor {name!r} is missing", path=weights, hint=_HINT)
        if tensor.shape != shape:
            raise InputError(
                f"tensor {name!r} has shape {list(tensor.shape)} but config.json implies "
                f"{list(shape)}",
                path=weights,
                hint=_HINT,
            )
    unused = sorted(n for n in tensors if n not in expected)
    unknown = [n for n in unused if n not in UNUSED]
    if unknown:
        raise InputError(
            f"tensor {unknown[0]!r} is not one MOSS-TTS-Nano has ({len(unknown)} such)",
            path=weights,
            hint="the weights are of another model or another version of Nano",
        )
    _weights_sound({name: tensors[name] for name in expected}, tied, weights)
    tokenizer = root / TOKENIZER_NAME
    tokenizer = confined(tokenizer, edge) if present(tokenizer) else None
    if tokenizer is not None:
        problem = tokenizer_problem(tokenizer, nano.dims.vocab)
        if problem:
            raise InputError(problem, path=tokenizer, hint="download the release's tokenizer.model "
                             "again")  # fmt: skip
    return NanoCheckpoint(root, config, nano, tensors, weights, tokenizer, unused,
                          stored_dtype(tensors, expected), declared_dtype(config))  # fmt: skip


def stored_dtype(tensors: dict[str, np.ndarray], names: Iterable[str]) -> str:
    """The dtype NAMES are stored in: one name, or the mixed ones sorted and joined by "+"."""
    return "+".join(sorted({tensors[name].dtype.name for name in names}))


SAMPLE = "Hello, world! 你好，世界。 12:30"  # Latin, CJK, digits and punctuation


def tokenizer_problem(path: Path, vocab: int) -> str | None:
    """Why the tokenizer at PATH cannot speak, or None: it loads, encodes a sample to ids, and
    every id it can give lies inside the text table of VOCAB rows."""
    # lazy: sentencepiece loads only when a tokenizer is checked
    from .prompt import NanoTokenizer

    try:
        tok = NanoTokenizer(path)
    except InputError as exc:
        return exc.message
    pieces = tok.pieces()
    if pieces > vocab:
        return f"holds {pieces} pieces but the text table has {vocab} rows"
    if not tok.encode(SAMPLE):
        return "encodes a sample text to no ids"
    return None


def _weights_sound(weights: dict[str, np.ndarray], tied: dict[str, str], path: Path) -> None:
    """Every weight a float of a width the folder holds exactly, finite, and each head equal to
    the table its family ties it to (the folder speaks with the table: a head that differs would
    be replaced silently by another model's values)."""
    odd = [n for n, a in weights.items() if a.dtype.name not in WEIGHT_DTYPES]
    if odd:
        more = f" (and {len(odd) - 1} more tensors)" if len(odd) > 1 else ""
        raise InputError(f"tensor {odd[0]!r} is stored as {weights[odd[0]].dtype}{more}; "
                         "MOSS-TTS-Nano weights are float32, float16 or bfloat16",
                         path=path, hint="the weights are of another model or a broken "
                         "export")  # fmt: skip
    broken = [n for n, a in weights.items() if not np.isfinite(a).all()]
    if broken:
        more = f" (and {len(broken) - 1} more tensors)" if len(broken) > 1 else ""
        raise InputError(f"tensor {broken[0]!r} holds NaN or infinite values{more}; a folder "
                         "made of it could not speak", path=path,
                         hint="the checkpoint is corrupt; download it again")  # fmt: skip
    for head, table in tied.items():
        a, b = weights[head], weights[table]
        if a is not b and not np.array_equal(a, b):
            raise InputError(f"tensor {head!r} differs from {table!r}; MOSS-TTS-Nano ties each "
                             "head to its table, and the folder would speak with the table",
                             path=path, hint="the weights are not a MOSS-TTS-Nano release's "
                             "(its heads are tied)")  # fmt: skip


def _read_weights(root: Path, edge: Path) -> tuple[Path, dict[str, np.ndarray]]:
    if present(root / INDEX_NAME) or present(root / SINGLE_NAME):
        shards, refs = read_tensors(root)
        where = root / INDEX_NAME if (root / INDEX_NAME).is_file() else shards[0]
        return where, {name: _from_safetensors(ref.array(), ref.dtype) for name, ref in
                       refs.items()}  # fmt: skip
    path = root / TORCH_NAME
    if not present(path):
        raise InputError(
            f"neither {SINGLE_NAME} nor {TORCH_NAME} is here",
            path=root,
            hint="point --model at a MOSS-TTS-Nano checkpoint folder",
        )
    # lazy: the unpickler's bf16 storage type imports ml_dtypes (half a second; bf16.py)
    from ..source.torch_pickle import read_state_dict

    return path, read_state_dict(confined(path, edge)).tensors


def _from_safetensors(raw: np.ndarray, dtype: str) -> np.ndarray:
    # source/safetensors_io keeps bf16 as its bits; the Nano room speaks ml_dtypes' bfloat16
    return raw.view(bfloat16()) if dtype == "BF16" else raw
