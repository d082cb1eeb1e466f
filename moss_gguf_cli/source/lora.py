"""LoRA adapters (PEFT's layout) merged into a checkpoint's tensors as they stream.

An adapter is a folder (or a Hub repo) with `adapter_config.json` and
`adapter_model.safetensors`, keys `base_model.model.<module>.lora_A.weight` [r, in] and
`.lora_B.weight` [out, r] (an embedding: `.lora_embedding_A` [r, rows] and
`.lora_embedding_B` [cols, r], merged transposed). Each targeted tensor W becomes
W + s·B·A in float32, s = SCALE·alpha/r (alpha/√r with `use_rslora`; `rank_pattern` and
`alpha_pattern` matched as PEFT matches them), before any rounding or quantization: the
merge is a `TensorDelta` hung on the checkpoint's `TensorRef`, and every reader of that
tensor (the GGUF writer, the direct quantizer, extract's tables, verify) adds its rows.

Everything is checked before anything is written: the PEFT type (LoRA only; DoRA refused),
every key, every shape against the base, the layer a module names, and the base the adapter
says it was trained on against the source when both are known (`--force-base` overrides).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..disk.confine import boundary, confined
from ..errors import InputError
from ..progress import ProgressReporter
from .checkpoint import MossCheckpoint, TensorRef
from .safetensors_io import SafetensorsFile, read_header, to_f32

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
# the four kinds of key a LoRA adapter holds: (suffix, which factor, an embedding's)
_KEYS = ((".lora_A.weight", "A", False), (".lora_B.weight", "B", False),
         (".lora_embedding_A", "A", True), (".lora_embedding_B", "B", True))  # fmt: skip
# rows of a delta computed at once: every reader gets a row's bits from the same product
BLOCK_ROWS = 256
_LAYER = re.compile(r"\.layers\.(\d+)\.")
MERGE_WITH_PEFT = "merge it with PEFT's merge_and_unload, then convert the result"


@dataclass(frozen=True)
class AdapterSpec:
    """`--merge-lora ADAPTER[:SCALE]` as given."""

    ref: str
    scale: float = 1.0

    @classmethod
    def parse(cls, text: str) -> AdapterSpec:
        head, sep, tail = text.rpartition(":")
        if sep and head:
            try:
                return cls(head, float(tail))
            except ValueError:
                pass  # a colon in a path: no scale
        return cls(text)


@dataclass
class Adapter:
    """An opened adapter: where it is, its config, its weights' header, its files' digests."""

    spec: AdapterSpec
    folder: Path
    repo: str | None  # the Hub id it came from, if any
    config: dict
    weights: SafetensorsFile
    sha256: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict:
        """What the manifest says of it."""
        return {"adapter": self.repo or str(self.folder), "scale": self.spec.scale,
                "sha256": dict(self.sha256)}  # fmt: skip


@dataclass
class TensorDelta:
    """The float32 update of one tensor, s·B·A summed over the adapters that target it,
    kept as the factors: only the rows asked for are computed, a block at a time."""

    shape: tuple[int, int]
    pairs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (s·B, A)
    # the block last computed, reused (no allocation a chunk); two readers may share a tensor
    # (extract's table and the GGUF pass both read the text embedding and head)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _first: int = field(default=-1, repr=False)
    _block: np.ndarray | None = field(default=None, repr=False)
    _term: np.ndarray | None = field(default=None, repr=False)

    def add_to(self, rows: np.ndarray, start: int) -> np.ndarray:
        """ROWS (float32, rows START..) += the update, in place. The update is computed in
        fixed blocks of BLOCK_ROWS, so a row gets the same bits whoever asks and however many
        rows they ask for (BLAS sums a product's terms in an order its shape may change)."""
        n = rows.shape[0]
        with self._lock:
            at = start
            while at < start + n:
                first = at - at % BLOCK_ROWS
                block = self._block_at(first)
                take = min(start + n, first + block.shape[0]) - at
                rows[at - start:at - start + take] += block[at - first:at - first + take]
                at += take
            if start + n >= self.shape[0]:  # read to its end: hold no buffer (tens of MB) on
                self._block = self._term = None  # for every tensor the run has merged
                self._first = -1
        return rows

    def _block_at(self, first: int) -> np.ndarray:
        last = min(first + BLOCK_ROWS, self.shape[0])
        if self._block is None:
            self._block = np.empty((BLOCK_ROWS, self.shape[1]), np.float32)
            self._term = np.empty_like(self._block)
        block = self._block[: last - first]
        if self._first != first:
            term = self._term[: last - first]
            for i, (left, right) in enumerate(self.pairs):
                np.matmul(left[first:last], right, out=term if i else block)
                if i:
                    block += term
            self._first = first
        return block

    def rows(self, start: int, n: int) -> np.ndarray:
        """Rows [start, start + n) of the update."""
        return self.add_to(np.zeros((n, self.shape[1]), np.float32), start)

    def merged(self, raw: np.ndarray, dtype: str, start: int,
               out: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """Source rows RAW (storage dtype DTYPE, rows from START) plus the update, float32,
        in OUT when given (the caller's reused buffer)."""
        raw = np.asarray(raw).reshape(-1, self.shape[1])
        out = np.empty(raw.shape, np.float32) if out is None else out
        if dtype == "BF16":  # bf16 is the top half of an f32: exact
            np.left_shift(raw, 16, out=out.view(np.uint32), dtype=np.uint32)
        else:
            np.copyto(out, raw, casting="unsafe")
        return self.add_to(out, start)


# ----------------------------------------------------------------------------- opening


def open_adapter(spec: AdapterSpec, cache_dir: Path | None = None,
                 progress: ProgressReporter | None = None) -> Adapter:  # fmt: skip
    """The adapter SPEC names: a local folder, else a Hub id (downloaded, or from the cache
    offline). Its config and weights' header read and checked; its files hashed."""
    from .hub import download, is_repo_id

    folder, repo = Path(spec.ref).expanduser(), None
    if not folder.is_dir():
        if not is_repo_id(spec.ref):
            raise InputError("is neither an adapter folder nor a Hub id", path=folder,
                             hint="give a folder with adapter_config.json and "
                             "adapter_model.safetensors, or a Hub id")  # fmt: skip
        repo = spec.ref
        folder = download(repo, [CONFIG, WEIGHTS], cache_dir=cache_dir, progress=progress)
    files = {}
    for name in (CONFIG, WEIGHTS):
        path = folder / name
        if not path.is_file():
            raise InputError(f"no {name} in the adapter", path=folder,
                             hint="an adapter saved by PEFT's save_pretrained has "
                             f"{CONFIG} and {WEIGHTS}")  # fmt: skip
        files[name] = confined(path, boundary(folder))
    config = _read_config(files[CONFIG])
    sha = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in files.items()}
    return Adapter(spec, folder, repo, config, read_header(files[WEIGHTS]), sha)


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"cannot be read as JSON ({exc})", path=path) from None
    if not isinstance(config, dict):
        raise InputError("is not a JSON object", path=path)
    kind = str(config.get("peft_type", "")).upper()
    if kind != "LORA":
        raise InputError(f"is a {kind or 'untyped'} adapter; only LoRA adapters can be merged",
                         path=path, hint="convert a LoRA adapter (peft_type LORA)")  # fmt: skip
    if config.get("use_dora"):
        raise InputError("is a DoRA adapter (use_dora): its magnitude vectors are not a "
                         "low-rank update and are not merged here", path=path,
                         hint=MERGE_WITH_PEFT)  # fmt: skip
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), int | float) or config[key] <= 0:
            raise InputError(f"has no positive {key}", path=path)
    return config


# ----------------------------------------------------------------------------- planning


def pattern_value(patterns: dict, module: str, default: float) -> float:
    """A rank_pattern / alpha_pattern value as PEFT picks it: the first key the module name
    ends with (after a dot), else the config's value."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return float(value)
    return float(default)


def lora_factors(adapter: Adapter) -> dict[str, dict[str, tuple[str, bool]]]:
    """module → {"A"/"B": (key, is_embedding)}; any other key refused, naming it."""
    path = adapter.weights.path
    found: dict[str, dict[str, tuple[str, bool]]] = {}
    for key in adapter.weights.tensors:
        if not key.startswith(PREFIX):
            raise InputError(f"holds {key!r}, not a key PEFT writes ({PREFIX}...)", path=path)
        body = key[len(PREFIX):]
        kind = next(((body[: -len(s)], f, emb) for s, f, emb in _KEYS if body.endswith(s)), None)
        if kind is None:
            what = "DoRA magnitudes" if "magnitude" in key else "full weights (modules_to_save)"
            raise InputError(f"holds {key!r}: {what}, not a LoRA update", path=path,
                             hint=MERGE_WITH_PEFT)  # fmt: skip
        module, factor, emb = kind
        found.setdefault(module, {})[factor] = (key, emb)
    for module, pair in found.items():
        if set(pair) != {"A", "B"}:
            raise InputError(f"has lora_{'B' if 'A' in pair else 'A'} of {module} missing",
                             path=path)  # fmt: skip
    return found


def _target(ck: MossCheckpoint, module: str, path: Path) -> TensorRef:
    for name in (f"{module}.weight", f"{module.removeprefix('model.')}.weight"):
        if name in ck.tensors:
            return ck.tensors[name]
    layer = _LAYER.search(f".{module}.")
    if layer and int(layer.group(1)) >= ck.moss.num_layers:
        raise InputError(f"targets layer {layer.group(1)} ({module}); the base has "
                         f"{ck.moss.num_layers} layers: an adapter for another model", path=path,
                         hint="merge it into the base it was trained on")  # fmt: skip
    raise InputError(f"targets {module}, which the base does not have: an adapter for "
                     "another model", path=path, hint="merge it into the base it was trained on")


def plan_merge(ck: MossCheckpoint, adapters: list[Adapter]) -> dict[str, TensorDelta]:
    """The update of every targeted tensor of CK (by its checkpoint name), all adapters
    stacked; every key and shape checked first."""
    deltas: dict[str, TensorDelta] = {}
    for adapter in adapters:
        path, cfg = adapter.weights.path, adapter.config
        for module, pair in sorted(lora_factors(adapter).items()):
            ref = _target(ck, module, path)
            if len(ref.shape) != 2:
                raise InputError(f"targets {module}, a {len(ref.shape)}-D tensor", path=path)
            a_key, emb = pair["A"]
            a, b = (adapter.weights.tensors[pair[f][0]] for f in ("A", "B"))
            rows, cols = ref.shape
            want_a, want_b = ((b.shape[1], rows), (cols, a.shape[0])) if emb else \
                ((b.shape[1], cols), (rows, a.shape[0]))  # fmt: skip
            if len(a.shape) != 2 or len(b.shape) != 2 or a.shape != want_a or b.shape != want_b:
                raise InputError(
                    f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit "
                    f"the base's {ref.name} {list(ref.shape)}: an adapter for another model",
                    path=path, hint="merge it into the base it was trained on")  # fmt: skip
            rank = pattern_value(cfg.get("rank_pattern"), module, cfg["r"])
            if int(rank) != a.shape[0]:
                raise InputError(f"{module} has rank {a.shape[0]}, its config says {rank:g}",
                                 path=adapter.folder / CONFIG)  # fmt: skip
            alpha = pattern_value(cfg.get("alpha_pattern"), module, cfg["lora_alpha"])
            scale = adapter.spec.scale * alpha / (math.sqrt(rank) if cfg.get("use_rslora")
                                                  else rank)  # fmt: skip
            fa, fb = (to_f32(np.asarray(t.memmap(path)), t.dtype) for t in (a, b))
            left, right = (fa.T * np.float32(scale), fb.T) if emb else (fb * np.float32(scale), fa)
            delta = deltas.setdefault(ref.name, TensorDelta((rows, cols)))
            delta.pairs.append((np.ascontiguousarray(left, np.float32),
                                np.ascontiguousarray(right, np.float32)))  # fmt: skip
    return deltas


def base_mismatch(adapter: Adapter, source: dict) -> str | None:
    """How the base the adapter names differs from SOURCE (made_from's identity), or None
    when they agree or either is unknown."""
    named = adapter.config.get("base_model_name_or_path")
    repo = source.get("repo")
    if not named or not repo or Path(str(named)).expanduser().exists():
        return None
    if str(named).strip("/") != repo:
        return f"was trained on {named}, this source is {repo}"
    revision = adapter.config.get("revision")
    commit = str(source.get("commit") or "")
    if revision and commit and not (commit.startswith(revision) or revision == "main"):
        return f"was trained on {named}@{revision}, this source is at {commit[:12]}"
    return None


def merged(ck: MossCheckpoint, deltas: dict[str, TensorDelta]) -> MossCheckpoint:
    """CK whose targeted tensors carry their update (every reader adds it)."""
    tensors = {name: replace(ref, delta=deltas[name]) if name in deltas else ref
               for name, ref in ck.tensors.items()}  # fmt: skip
    return replace(ck, tensors=tensors)
