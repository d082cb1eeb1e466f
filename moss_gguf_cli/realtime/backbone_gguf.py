"""MOSS-TTS-Realtime's backbone as a stock `qwen3` GGUF: llama.cpp loads it unchanged.

The backbone is a plain Qwen3Model (`language_model.*`). Upstream feeds it summed embeddings
and reads its last hidden state, never its LM head; the text rows it sums come from
`embed_tokens.0`, so that is the GGUF's `token_embd` (the engine reads text rows from it),
and the GGUF is tied (no `output.weight`: llama.cpp reuses `token_embd`, which nothing reads
as a head). `language_model.embed_tokens`, Qwen3Model's own table, is never read by
upstream's forward and is left out. The Qwen3 plan, its keys and its tokenizer keys are the
delay family's native writer's (gguf/write.py): the same decisions llama.cpp's converter makes.
"""

from __future__ import annotations

from pathlib import Path

from ..gguf.vocab import read_vocab
from ..gguf.write import GGUFPlan, OutType, Qwen3Params, SourceTensor, plan_backbone_tensors
from .checkpoint import RealtimeCheckpoint
from .config import TITLE

NAME = f"{TITLE} backbone"  # general.name
_RENAMES = (("embed_tokens.0.", "model.embed_tokens."), ("language_model.", "model."))


def backbone_sources(checkpoint: RealtimeCheckpoint) -> dict[str, SourceTensor]:
    """The backbone's tensors under Qwen3ForCausalLM's names, read in place."""
    out: dict[str, SourceTensor] = {}
    for name, ref in checkpoint.tensors.items():
        if name == "language_model.embed_tokens.weight":
            continue  # never read upstream (checkpoint.UNUSED)
        for old, new in _RENAMES:
            if name.startswith(old):
                out[new + name[len(old):]] = SourceTensor(
                    name, ref.path, ref.dtype, tuple(ref.shape), ref.offset, ref.nbytes)
                break
    return out


def backbone_config(checkpoint: RealtimeCheckpoint) -> dict:
    """language_config as a Qwen3ForCausalLM config: tied, so no head is looked for."""
    config = dict(checkpoint.config["language_config"])
    config.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                  tie_word_embeddings=True)  # fmt: skip
    return config


def plan_backbone(checkpoint: RealtimeCheckpoint, outtype: OutType) -> GGUFPlan:
    """The backbone GGUF's plan at OUTTYPE (F32, F16, BF16 or Q8_0, as the converter writes)."""
    config = backbone_config(checkpoint)
    path = checkpoint.root / "config.json"
    params = Qwen3Params.from_config(config, path)
    tensors = plan_backbone_tensors(params, backbone_sources(checkpoint), outtype, path)
    vocab = read_vocab(Path(checkpoint.root), config, params.vocab)
    return GGUFPlan(params, tensors, vocab, outtype, NAME)
