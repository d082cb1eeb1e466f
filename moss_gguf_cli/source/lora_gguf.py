"""A PEFT LoRA adapter planned as llama.cpp's adapter GGUF for a MOSS base (docs/lora.md).

The tensors are what llama.cpp's `convert_lora_to_gguf.py` writes given the extracted backbone
as `--base`: the factors as stored (`lora_A` → `.lora_a`, `lora_B` → `.lora_b`), in the order
of the adapter's sorted keys. Three things differ, each reported in the plan's notes:
- a pair with an all-zero factor is left out (it adds nothing and costs graph nodes: the
  community Norwegian adapter's attention pairs are untrained zeros);
- llama.cpp scales every tensor by alpha / its own rank and knows neither rsLoRA nor
  `alpha_pattern`: the file's alpha is alpha·√r under rsLoRA, and where a module's scale still
  differs from alpha_file / its rank (a pattern), the factor is folded into its `lora_b`;
- the base's identity is recorded (gguf/lora.py), and checked where the file is loaded.
Only the decoder layers' projections can be applied by llama.cpp at run time here: the text
embedding, the audio tables and the heads are computed outside llama.cpp (tts/), so an
adapter on them is refused, naming the merge route.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import gguf
import numpy as np

from ..errors import InputError
from ..gguf.lora import DIGEST_TENSOR, BaseIdentity, LoraTensor, config_hparams, table_digest
from .checkpoint import MossCheckpoint
from .lora import Adapter, lora_factors, pattern_value
from .safetensors_io import to_f32

MERGE_ROUTE = "merge it into the weights instead: moss-gguf all --model MODEL --merge-lora ADAPTER"
# a decoder layer's projection, under MOSS's prefix or a standalone Qwen3's
_PROJECTION = re.compile(
    r"^(?:language_model\.|model\.)?layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)$"
)


@dataclass
class AdapterGGUFPlan:
    tensors: list[LoraTensor]
    alpha: float
    identity: BaseIdentity
    left_out: list[str] = field(default_factory=list)  # modules with an all-zero factor
    folded: dict[str, float] = field(default_factory=dict)  # module → factor folded into B

    @property
    def notes(self) -> list[str]:
        out = []
        if self.left_out:
            some = ", ".join(self.left_out[:3]) + (", …" if len(self.left_out) > 3 else "")
            out.append(f"{len(self.left_out)} all-zero pairs left out ({some})")
        for module, factor in self.folded.items():
            out.append(f"{module}: its scale is alpha/rank × {factor:g}, folded into lora_b")
        return out


def base_identity(ck: MossCheckpoint, model: str) -> BaseIdentity:
    """CK's identity: MODEL (repo@commit, builtin name, or ""), its digest and dims."""
    digest = table_digest(ck.tensors[DIGEST_TENSOR].read_f32())
    return BaseIdentity(model, digest, config_hparams(ck.language_config, ck.moss.n_vq))


def _layer_tensor(ck: MossCheckpoint, module: str, path) -> tuple[str, str]:
    """(checkpoint name, Qwen3ForCausalLM name) of a projection MODULE names; anything else
    refused in one line."""
    m = _PROJECTION.match(module)
    if m is None:
        raise InputError(f"targets {module}, which llama.cpp cannot apply at run time here "
                         "(only the decoder layers' projections)", path=path,
                         hint=MERGE_ROUTE)  # fmt: skip
    layer, rest = int(m.group(1)), m.group(2)
    if layer >= ck.moss.num_layers:
        raise InputError(f"targets layer {layer} ({module}); the base has {ck.moss.num_layers} "
                         "layers: an adapter for another model", path=path)  # fmt: skip
    return f"language_model.layers.{layer}.{rest}.weight", f"model.layers.{layer}.{rest}.weight"


def plan_adapter_gguf(ck: MossCheckpoint, adapter: Adapter, model: str) -> AdapterGGUFPlan:
    """ADAPTER as llama.cpp's adapter GGUF for base CK (named MODEL in the file)."""
    path, cfg = adapter.weights.path, adapter.config
    rs = bool(cfg.get("use_rslora"))
    rank0, alpha0 = float(cfg["r"]), float(cfg["lora_alpha"])
    alpha_file = alpha0 * math.sqrt(rank0) if rs else alpha0
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, ck.moss.num_layers)
    pairs = lora_factors(adapter)
    plan = AdapterGGUFPlan([], alpha_file, base_identity(ck, model))
    # the converter's order: the adapter's keys sorted, a module at its first key
    for module in sorted(pairs, key=lambda m: min(k for k, _ in pairs[m].values())):
        source, hf = _layer_tensor(ck, module, path)
        a_info, b_info = (adapter.weights.tensors[pairs[module][f][0]] for f in ("A", "B"))
        rows, cols = ck.tensors[source].shape
        rank = a_info.shape[0]
        if a_info.shape != (rank, cols) or b_info.shape != (rows, rank):
            raise InputError(
                f"{module}: lora_A {list(a_info.shape)} and lora_B {list(b_info.shape)} do not "
                f"fit the base's {source} {[rows, cols]}: an adapter for another model",
                path=path,
            )
        want_rank = pattern_value(cfg.get("rank_pattern"), module, rank0)
        if int(want_rank) != rank:
            raise InputError(f"{module} has rank {rank}, its config says {want_rank:g}",
                             path=adapter.folder / "adapter_config.json")  # fmt: skip
        a, b = (to_f32(np.asarray(t.memmap(path)), t.dtype) for t in (a_info, b_info))
        if not a.any() or not b.any():
            plan.left_out.append(module)
            continue
        alpha = pattern_value(cfg.get("alpha_pattern"), module, alpha0)
        # PEFT's scale over llama.cpp's (alpha_file / rank): 1 unless a pattern applies
        factor = (alpha / alpha0) * (math.sqrt(rank / rank0) if rs else 1.0)
        if factor != 1.0:
            b = b * np.float32(factor)
            plan.folded[module] = factor
        gguf_name = names.get_name(hf, try_suffixes=(".weight",))
        plan.tensors += [LoraTensor(f"{gguf_name}.lora_a", a), LoraTensor(f"{gguf_name}.lora_b", b)]
    if not plan.tensors:
        raise InputError("holds no nonzero update for the base", path=path,
                         hint="every pair has an all-zero factor: is it trained?")  # fmt: skip
    return plan
