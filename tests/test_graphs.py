"""graphs/: small graphs built with its builders compute what NumPy computes (layer and RMS
norm, linear, rope in both modes, causal attention over split heads, views), every node is
dumped by the name it was given (Nano's own graphs too), and the type enum is ggml's (names,
sizes, blocks asked of the loaded libggml). Real libggml calls throughout."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from moss_gguf_cli.graphs import (
    TYPE_IDS,
    GgmlType,
    Graph,
    Rope,
    RopeMode,
    Weights,
    attention,
    block_size,
    causal_mask,
    layer_norm,
    linear,
    merge_heads,
    numpy_dtype,
    overhead,
    rms_norm,
    rope,
    row_size,
    tensor_bytes,
    type_size,
)
from moss_gguf_cli.nano.config import TransformerDims
from moss_gguf_cli.nano.ggml_global import GgmlGlobal
from moss_gguf_cli.nano.ggml_local import GgmlLocal
from moss_gguf_cli.native import libggml
from moss_gguf_cli.tts.sampling import Sampler, SamplingParams

F32 = GgmlType.F32
AUTO_NAMED = (" (view)", " (reshaped)", " (permuted)", " (cont)", " (copy", " (transposed)")


def test_the_type_enum_is_ggmls():
    base = libggml.load().base
    for t in GgmlType:
        assert base.ggml_type_name(int(t)).decode().upper() == t.name
        assert type_size(t) == base.ggml_type_size(int(t)) > 0
        assert row_size(t, block_size(t)) == type_size(t)
    plain = [t for t in GgmlType if block_size(t) == 1]
    assert {GgmlType.F32, GgmlType.F16, GgmlType.I32, GgmlType.I64} <= set(plain)
    for t in plain:
        if t != GgmlType.BF16:  # NumPy has no bfloat16
            assert numpy_dtype(t).itemsize == type_size(t)
    assert (block_size(GgmlType.Q8_0), type_size(GgmlType.Q8_0)) == (32, 34)
    assert tensor_bytes(GgmlType.Q8_0, (64, 3)) == 3 * 68
    assert TYPE_IDS["Q8_0"] is GgmlType.Q8_0 and int(TYPE_IDS["I32"]) == 26
    with pytest.raises(ValueError):
        numpy_dtype(GgmlType.Q8_0)


def test_a_tensor_reads_its_shape_strides_and_name_from_ggml():
    with Graph(8) as g:
        t = g.new_tensor("cache", GgmlType.F16, (5, 3, 2))
        assert (t.type, t.ne, t.nb, t.nelements, t.nbytes) == (GgmlType.F16, (5, 3, 2),
                                                                (2, 10, 30), 30, 60)
        assert (t.name, t.op) == ("cache", "NONE")
        v = g.view(t, (2, 3), offset=1, steps=(5,), name="cols_1_2")
        assert (v.ne, v.nb, v.op) == ((2, 3), (2, 10), "VIEW")
        with pytest.raises(ValueError):
            g.add(t, t, name="x" * 64)  # ggml would cut it short


def _layer_norm(x, w, b, eps=1e-5):
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * w + b


def test_norms_linear_and_a_view_compute_what_numpy_does():
    rng = np.random.default_rng(0)
    rows, n_in, n_out = 3, 64, 24
    w_in, b_in = rng.standard_normal(n_in), rng.standard_normal(n_in)
    matrix, bias = rng.standard_normal((n_out, n_in)), rng.standard_normal(n_out)
    store = Weights(4 * (2 * n_in + n_out * (n_in + 1)) + overhead(4))
    w, b = store.from_numpy("ln.weight", w_in), store.from_numpy("ln.bias", b_in)
    m, mb = store.from_numpy("fc.weight", matrix), store.from_numpy("fc.bias", bias)
    with Graph(32, label="a test graph") as g:
        x = g.input("x", F32, (n_in, rows))
        ln = layer_norm(g, x, weight=w, bias=b, eps=1e-5, name="ln")
        fc = g.output(linear(g, ln, m, mb, name="fc"))
        rms = g.output(rms_norm(g, x, weight=w, eps=1e-6, name="rms"))
        cols = g.view(x, (8, rows), offset=4, name="cols")  # x's columns 4..11, every row
        cols = g.output(g.cont(cols, (8, rows), name="cols_copy"))
        for t in (fc, rms, cols):
            g.expand(t)
        g.allocate()
        values = rng.standard_normal((rows, n_in)).astype(np.float32)
        g.inputs["x"][:] = values
        g.compute(2)
        want = _layer_norm(values, w_in, b_in) @ matrix.T + bias
        np.testing.assert_allclose(g.outputs["fc"], want, rtol=1e-4, atol=1e-4)
        want = values / np.sqrt((values.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(g.outputs["rms"], want * w_in, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(g.outputs["cols_copy"], values[:, 4:12])
    store.close()


def _rope(x, positions, mode, base):
    """x (rows, heads, hd) rotated: NORMAL pairs (2i, 2i + 1), NEOX pairs (i, i + hd / 2)."""
    hd = x.shape[-1]
    angles = positions[:, None, None] * base ** (-np.arange(0, hd, 2) / hd)  # (rows, 1, hd/2)
    cos, sin = np.cos(angles), np.sin(angles)
    if mode == RopeMode.NORMAL:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if mode == RopeMode.NORMAL:
        return np.stack([ra, rb], -1).reshape(x.shape)
    return np.concatenate([ra, rb], -1)


@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX])
def test_rope_rotates_as_numpy_does(mode):
    rng = np.random.default_rng(1)
    rows, heads, hd = 5, 2, 16
    with Graph(16) as g:
        x = g.input("x", F32, (hd, heads, rows))
        pos = g.input("pos", GgmlType.I32, (rows,))
        settings = Rope(n_dims=hd, mode=mode, freq_base=500.0)
        g.expand(g.output(rope(g, x, pos, settings, name="roped")))
        g.allocate()
        values = rng.standard_normal((rows, heads, hd)).astype(np.float32)
        at = np.array([0, 1, 7, 30, 2])
        g.inputs["x"][:], g.inputs["pos"][:] = values, at
        g.compute()
        np.testing.assert_allclose(g.outputs["roped"], _rope(values, at, mode, 500.0),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip


def test_causal_attention_over_split_heads_is_numpys():
    rng = np.random.default_rng(2)
    rows, heads, hd = 4, 2, 8
    with Graph(32) as g:
        q = g.input("q", F32, (hd, rows, heads))
        k = g.input("k", F32, (hd, rows, heads))
        v = g.input("v_t", F32, (rows, hd, heads))  # transposed: a channel's keys contiguous
        mask = g.input("mask", F32, (rows, rows))
        mixed = attention(g, q, k, v, mask=mask, scale=hd**-0.5, name="attn")
        g.expand(g.output(merge_heads(g, mixed, name="merged")))
        g.allocate()
        qs, ks, vs = (rng.standard_normal((heads, rows, hd)).astype(np.float32) for _ in "qkv")
        g.inputs["q"][:], g.inputs["k"][:] = qs, ks
        g.inputs["v_t"][:] = vs.transpose(0, 2, 1)
        g.inputs["mask"][:] = causal_mask(np.arange(rows), rows)
        g.compute(2)
        scores = qs @ ks.transpose(0, 2, 1) * hd**-0.5 + np.triu(np.full((rows, rows), -np.inf), 1)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        want = (probs @ vs).transpose(1, 0, 2).reshape(rows, heads * hd)
        np.testing.assert_allclose(g.outputs["merged"], want, rtol=1e-4, atol=1e-5)
        nodes = g.dump()
        assert [n.name for n in nodes] == ["attn.scores", "attn.probs", "attn", "merged.heads",
                                           "merged"]  # fmt: skip
        assert nodes[0] == ("attn.scores", "MUL_MAT", "F32", (rows, rows, heads))
        assert nodes[-1] == ("merged", "CONT", "F32", (hd * heads, rows))
        assert g.tensor("attn.probs").op == "SOFT_MAX" and g.tensor("mask").op == "NONE"


def _named_by_us(nodes) -> None:
    names = [n.name for n in nodes]
    assert names and all(names), "a node without a name"
    assert len(set(names)) == len(names), "two nodes of one name"
    assert not [n for n in names if any(mark in n for mark in AUTO_NAMED)]


def test_nanos_local_frame_names_every_node():
    rng = np.random.default_rng(3)
    dims = TransformerDims(hidden=32, layers=1, heads=2, inner=64, vocab=10, context=None,
                           eps=1e-5, rope_base=10000.0, activation="gelu_new")  # fmt: skip
    h = dims.hidden
    shapes = {"ln_1": (h,), "ln_2": (h,), "attn.c_attn": (3 * h, h), "attn.c_proj": (h, h),
              "mlp.fc_in": (64, h), "mlp.fc_out": (h, 64)}  # fmt: skip
    arrays = {f"h.0.{n}.{k}": rng.standard_normal(s if k == "weight" else s[:1]).astype(
        np.float32) for n, s in shapes.items() for k in ("weight", "bias")}  # fmt: skip
    arrays |= {"ln_f.weight": np.ones(h, np.float32), "ln_f.bias": np.zeros(h, np.float32)}
    heads = [rng.standard_normal((2 if p == 0 else 40, h)).astype(np.float32) for p in range(4)]
    local = GgmlLocal(arrays, dims, 1, heads, heads[0][0], "Q8_0", threads=1)
    try:
        for params in (SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.9, 5, 1.2)):
            picks = local.frame(rng.standard_normal(h), Sampler(params, params, seed=1), True)
            assert picks.shape == (4,)
        for graph in local.graphs():
            nodes = graph.dump()
            _named_by_us(nodes)
            assert {"p0.h0.attn", "p3.h0.out", "p3.logits"} <= {n.name for n in nodes}
    finally:
        local.close()


def test_nanos_global_graphs_name_every_node(tmp_path):
    rng = np.random.default_rng(4)
    h, inner = 32, 64
    path = tmp_path / "global.gguf"
    w = gguf.GGUFWriter(str(path), "starcoder2")
    for key, value in (("embedding_length", h), ("block_count", 1), ("feed_forward_length",
                       inner), ("attention.head_count", 2)):  # fmt: skip
        w.add_uint32(f"starcoder2.{key}", value)
    w.add_float32("starcoder2.attention.layer_norm_epsilon", 1e-5)
    w.add_float32("starcoder2.rope.freq_base", 10000.0)
    shapes = {"attn_norm": (h,), "attn_qkv": (3 * h, h), "attn_output": (h, h),
              "ffn_norm": (h,), "ffn_up": (inner, h), "ffn_down": (h, inner)}  # fmt: skip
    for name, shape in shapes.items():
        w.add_tensor(f"blk.0.{name}.weight", rng.standard_normal(shape).astype(np.float32))
        w.add_tensor(f"blk.0.{name}.bias", rng.standard_normal(shape[0]).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    w.add_tensor("output_norm.bias", np.zeros(h, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = GgmlGlobal(path, 64, threads=1)
    try:
        model.prefill(rng.standard_normal((3, h)).astype(np.float32))
        out = model.step(rng.standard_normal(h).astype(np.float32))
        assert out.shape == (h,) and np.isfinite(out).all()
        (graph,) = model.graphs()
        nodes = graph.dump()
        _named_by_us(nodes)
        names = [n.name for n in nodes]
        assert names[:2] == ["blk.0.attn_norm.normed", "blk.0.attn_norm.scaled"]
        assert names[-1] == "output_norm" and "blk.0.k_write" in names
    finally:
        model.close()
