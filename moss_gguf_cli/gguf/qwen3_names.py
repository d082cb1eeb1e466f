"""The Qwen3 tensor-name table: one decoder layer's tensors by Hugging Face name, with shapes.

The MOSS checkpoint keeps them under ``language_model.layers.N.`` (source/checkpoint.py,
source/tiny.py), the extracted Qwen3ForCausalLM under ``model.layers.N.`` (gguf/write.py,
verify/reference.py); the GGUF names (``blk.N.attn_q``…) come from the gguf package's own map.
"""

from __future__ import annotations


def layer_shapes(
    prefix: str, hidden: int, q: int, kv: int, ff: int, head_dim: int
) -> dict[str, tuple[int, ...]]:
    """PREFIX + name → shape of one layer, in Qwen3ForCausalLM's order.

    q and kv are the query and key/value widths (heads × head_dim)."""
    h = hidden
    return {
        prefix + "input_layernorm.weight": (h,),
        prefix + "self_attn.q_proj.weight": (q, h),
        prefix + "self_attn.q_norm.weight": (head_dim,),
        prefix + "self_attn.k_proj.weight": (kv, h),
        prefix + "self_attn.k_norm.weight": (head_dim,),
        prefix + "self_attn.v_proj.weight": (kv, h),
        prefix + "self_attn.o_proj.weight": (h, q),
        prefix + "post_attention_layernorm.weight": (h,),
        prefix + "mlp.gate_proj.weight": (ff, h),
        prefix + "mlp.up_proj.weight": (ff, h),
        prefix + "mlp.down_proj.weight": (h, ff),
    }
