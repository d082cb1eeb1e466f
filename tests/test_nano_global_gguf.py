"""nano/global_gguf.py: the global transformer as an F32 starcoder2 GGUF, run by the pinned
llama.cpp (inputs fed as embeddings), against upstream's math in float64 over a prompt and
40 teacher-forced frames.

The reference is written here from upstream's gpt2_decoder.py (OpenMOSS/MOSS-TTS-Nano at
42b4645): pre-LN blocks, RoPE on interleaved pairs, 1/sqrt(head size), tanh GELU. One part of
llama.cpp's arithmetic is not upstream's and no GGUF can change it: ggml's CPU GELU reads a
float16 table (GGML_GELU_FP16 in ggml-cpu/vec.h: the input rounded to f16, the output an f16).
So parity is checked twice: with the GELU evaluated as ggml evaluates it, everything else (the
q/k permutation, rope, norms, attention, biases) agrees to 1e-4 over the whole array at these
dims; against upstream's exact GELU the bar is 5e-4, not issue #47's 1e-4, because of
GGML_GELU_FP16 (the table costs about 3e-4): 1e-4 against upstream's exact math is out of reach
of any llama.cpp architecture whose FFN is ggml_gelu, and patching llama.cpp is not an option
(the pinned build is the user's). Whether 5e-4 is acceptable is #47's open question.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tiny_nano import nano_config, release_state, write_release

from moss_gguf_cli.nano.checkpoint import open_nano
from moss_gguf_cli.nano.global_gguf import neox_order, write_global_f32
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

CONFIG = nano_config(n_embd=128, n_head=4, n_layer=3, n_inner=384, vocab_size=64)
PROMPT_ROWS, FRAMES = 24, 40
# Measured on this file's checkpoints (worst of the two): against the reference with ggml's
# GELU, 4.6e-5 over the whole array and 1.3e-4 on the worst row (a row where an f16 rounding
# of a GELU input fell the other way); against upstream's exact GELU 2.6e-4 and 3.3e-4, which
# is the table's cost. At Nano's real dims (768, 12 layers, 12 heads, 16384 × 768, bf16 .bin,
# random weights as tiny_nano makes them, 64 rows; run once by hand, not a test): 1.26e-4 /
# 1.57e-4 with ggml's GELU, 2.5e-4 / 2.8e-4 against the exact GELU: more f16 roundings of GELU
# inputs fall the other way, so "everything else to 1e-4" holds at these tiny dims only.
EXACT = 1e-4  # the whole array, GELU as ggml evaluates it
EXACT_ROW = 2e-4  # the worst row, GELU as ggml evaluates it
TABLE = 5e-4  # the whole array against upstream's exact GELU
TABLE_ROW = 1e-3  # the worst row against upstream's exact GELU
WRONG = 1e-2  # a GGUF without the permutation is at least this far off


def gelu_exact(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))


def gelu_ggml(x: torch.Tensor) -> torch.Tensor:
    """ggml's CPU GELU: f16 input, the tanh form in f32, an f16 output; ±10 clamps."""
    half = x.to(torch.float16).to(torch.float32)
    table = gelu_exact(half).to(torch.float16).to(torch.float64)
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, table))


def layer_norm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def rotate_pairs(t: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE on interleaved pairs (2i, 2i+1) of each head, as complex numbers turned by pos·θ_i."""
    seq, _, dim = t.shape
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    turn = torch.polar(torch.ones(seq, dim // 2, dtype=torch.float64),
                       torch.arange(seq, dtype=torch.float64)[:, None] * theta)  # fmt: skip
    pairs = torch.view_as_complex(t.reshape(seq, -1, dim // 2, 2).contiguous())
    return torch.view_as_real(pairs * turn[:, None]).reshape(t.shape)


def upstream_hidden(opened, embeds: np.ndarray, gelu) -> np.ndarray:
    """ln_f(blocks(embeds)) in float64, upstream's block: x + attn(ln_1 x); x + mlp(ln_2 x)."""
    dims = opened.nano.dims
    w = {n: torch.from_numpy(np.asarray(a, dtype=np.float64)) for n, a in opened.tensors.items()}
    x = torch.from_numpy(embeds).double()
    seq, heads, dim = x.shape[0], dims.heads, dims.head_dim
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    for i in range(dims.layers):
        p = f"transformer.h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], dims.eps)
        qkv = h @ w[p + "attn.c_attn.weight"].T + w[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(seq, heads, dim) for t in qkv.split(dims.hidden, dim=-1))
        q, k = rotate_pairs(q, dims.rope_base), rotate_pairs(k, dims.rope_base)
        scores = torch.einsum("qhd,khd->hqk", q, k) / dim**0.5
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(seq, dims.hidden)
        x = x + attn @ w[p + "attn.c_proj.weight"].T + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], dims.eps)
        inner = gelu(h @ w[p + "mlp.fc_in.weight"].T + w[p + "mlp.fc_in.bias"])
        x = x + inner @ w[p + "mlp.fc_out.weight"].T + w[p + "mlp.fc_out.bias"]
    out = layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], dims.eps)
    return out.numpy()


def frame_embeddings(opened, seed: int = 3) -> np.ndarray:
    """Rows [text, c0..c(n_vq-1)] as upstream sums them: wte[text] + Σ_q [c_q ≠ pad] table_q[c_q];
    a text prompt (every code the pad), then teacher-forced frames (slot id, random codes)."""
    nano, rng = opened.nano, np.random.default_rng(seed)
    slot = nano.tokens["audio_assistant_slot_token_id"]
    text = np.concatenate([rng.integers(10, nano.dims.vocab, PROMPT_ROWS), np.full(FRAMES, slot)])
    codes = np.full((PROMPT_ROWS + FRAMES, nano.n_vq), nano.audio_pad)
    codes[PROMPT_ROWS:] = rng.integers(0, min(nano.codebook_sizes), (FRAMES, nano.n_vq))
    codes[PROMPT_ROWS + 5, 2] = nano.audio_pad  # a pad inside a frame adds nothing
    rows = np.asarray(opened.tensors["transformer.wte.weight"], np.float32)[text]
    for q in range(nano.n_vq):
        table = np.asarray(opened.tensors[f"audio_embeddings.{q}.weight"], np.float32)
        used = codes[:, q] != nano.audio_pad
        rows[used] += table[codes[used, q]]
    return rows


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    """‖ours − reference‖ / ‖reference‖ over the whole array."""
    return float(np.linalg.norm(ours - reference) / np.linalg.norm(reference))


def worst_row(ours: np.ndarray, reference: np.ndarray) -> float:
    """The worst row's ‖ours − reference‖ / ‖reference‖."""
    gap = np.linalg.norm(ours - reference, axis=1) / np.linalg.norm(reference, axis=1)
    return float(gap.max())


def llama_hidden(gguf, embeds: np.ndarray) -> np.ndarray:
    # f32 KV cache and no flash attention: the file's math, not a runtime's storage choices
    settings = BackboneSettings(n_ctx=128, n_batch=128, n_threads=2, kv_cache_type_k="f32",
                                kv_cache_type_v="f32", flash_attn="disabled")  # fmt: skip
    with Backbone(gguf, settings) as backbone:
        return backbone.hidden_states(embeds)


@pytest.fixture(scope="module", params=["bin-bf16", "safetensors-f32"])
def nano_gguf(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "bin-bf16":
        write_release(folder, CONFIG, release_state(CONFIG, torch.bfloat16))
    else:
        write_release(folder, CONFIG, release_state(CONFIG, torch.float32))
        state = release_state(CONFIG, torch.float32, seed=2)
        save_file({n: t for n, t in state.items() if "lm_head" not in n},
                  str(folder / "model.safetensors"))  # fmt: skip
    opened = open_nano(folder)
    gguf = write_global_f32(opened, folder / "global-f32.gguf")
    embeds = frame_embeddings(opened)
    return opened, gguf, embeds, llama_hidden(gguf, embeds)


def test_llamas_hidden_states_equal_upstreams_math(nano_gguf):
    opened, _, embeds, ours = nano_gguf
    assert ours.shape == (PROMPT_ROWS + FRAMES, 128) and np.isfinite(ours).all()
    ggml_gelu = upstream_hidden(opened, embeds, gelu_ggml)
    got = relative_error(ours, ggml_gelu), worst_row(ours, ggml_gelu)
    assert got[0] <= EXACT and got[1] <= EXACT_ROW, got
    exact = upstream_hidden(opened, embeds, gelu_exact)
    got = relative_error(ours, exact), worst_row(ours, exact)
    assert got[0] <= TABLE and got[1] <= TABLE_ROW, got


def test_the_permutation_is_what_makes_them_equal(nano_gguf, tmp_path):
    """Written unpermuted, the same weights run NEOX rope on the wrong pairs: far off (measured
    0.37 and 0.38 on these checkpoints; the bar is 1e-2, a hundred times the 1e-4 one)."""
    opened, _, embeds, _ = nano_gguf
    identity = {f"transformer.h.{i}.attn.c_attn.{k}" for i in range(3) for k in ("weight", "bias")}
    order = neox_order(opened.nano.dims.head_dim)
    back = np.argsort(order)  # undo the permutation, so the file holds upstream's rows as-is
    hidden, heads = opened.nano.hidden, opened.nano.dims.heads
    undo = np.arange(3 * hidden)
    for start in range(0, 2 * hidden, hidden // heads):
        undo[start : start + len(order)] = start + back
    tensors = dict(opened.tensors)
    for name in identity:
        tensors[name] = np.asarray(tensors[name], np.float32)[undo]
    gguf = write_global_f32(replace(opened, tensors=tensors), tmp_path / "unpermuted.gguf")
    wrong = relative_error(llama_hidden(gguf, embeds), upstream_hidden(opened, embeds, gelu_ggml))
    assert wrong > WRONG, wrong


def test_neox_order_puts_even_dims_first():
    assert neox_order(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
