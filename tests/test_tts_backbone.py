"""The llama.cpp backbone fed embeddings, against a torch reference Qwen3 forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_gguf

from moss_gguf_cli.errors import InputError
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

EXACT = BackboneSettings(
    n_ctx=256,
    n_batch=16,
    n_threads=1,
    kv_cache_type_k="f32",
    kv_cache_type_v="f32",
    flash_attn="disabled",
)


@pytest.fixture(scope="module")
def gguf_f32(builds, tiny_extracted: Path) -> Path:
    return tiny_gguf(builds, tiny_extracted, "f32")


@pytest.fixture(scope="module")
def gguf_f16(builds, tiny_extracted: Path) -> Path:
    return tiny_gguf(builds, tiny_extracted, "f16")


# ---------------------------------------------------------------- torch reference


class Qwen3Reference:
    """The team's float64 torch forward (moss_gguf_cli.verify.reference) over input embeddings."""

    def __init__(self, source: Path):
        from moss_gguf_cli.verify import reference

        self._reference = reference
        self._weights = reference.load_weights(source)

    def forward(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._reference.forward(self._weights, embeds, logits=True)


@pytest.fixture(scope="module")
def reference(tiny_extracted: Path) -> Qwen3Reference:
    return Qwen3Reference(tiny_extracted)


def _embeds(rows: int, seed: int = 0) -> np.ndarray:
    # sums of 33 table rows of the tiny model have about this scale
    return (np.random.default_rng(seed).standard_normal((rows, 256)) * 2.0).astype(np.float32)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# ---------------------------------------------------------------- accuracy


def test_f32_gguf_matches_the_reference(gguf_f32, reference):
    x = _embeds(40)
    ref_hidden, ref_logits = reference.forward(x)
    with Backbone(gguf_f32, EXACT) as backbone:
        assert backbone.n_embd == 256 and backbone.n_vocab == 151936
        hidden = backbone.hidden_states(x)  # every row, chunked by n_batch 16
        last, logits = backbone.prefill(x)
    assert _rel(hidden, ref_hidden) <= 1e-4
    assert _rel(last, ref_hidden[-1]) <= 1e-4
    assert _rel(logits, ref_logits[-1]) <= 1e-4


def test_f16_gguf_matches_the_reference(gguf_f16, reference):
    x = _embeds(40, seed=1)
    ref_hidden, ref_logits = reference.forward(x)
    with Backbone(gguf_f16, BackboneSettings(n_ctx=256, n_batch=32, n_threads=1)) as backbone:
        hidden = backbone.hidden_states(x)
        last, logits = backbone.prefill(x)
    assert _rel(hidden, ref_hidden) <= 1e-2
    assert _rel(last, ref_hidden[-1]) <= 1e-2
    assert _rel(logits, ref_logits[-1]) <= 1e-2


def test_steps_continue_the_prefill(gguf_f32, reference):
    x = _embeds(23, seed=2)  # a prompt of 20 rows: a chunk of 16, then the final 4
    ref_hidden, ref_logits = reference.forward(x)
    with Backbone(gguf_f32, EXACT) as backbone:
        backbone.prefill(x[:20])
        for i in range(20, 23):
            hidden, logits = backbone.step(x[i])
            assert _rel(hidden, ref_hidden[i]) <= 1e-4
            assert _rel(logits, ref_logits[i]) <= 1e-4
        assert backbone.n_past == 23


def test_kv_cache_is_cleared_per_utterance(gguf_f32):
    x, y = _embeds(12, seed=3), _embeds(9, seed=4)
    with Backbone(gguf_f32, EXACT) as backbone:
        first = backbone.prefill(x)[0].copy()
        backbone.reset()
        backbone.prefill(y)
        backbone.reset()
        again = backbone.prefill(x)[0].copy()
        np.testing.assert_array_equal(first, again)
        stale = backbone.prefill(x)[0].copy()  # no reset: continues the previous sequence
        assert backbone.n_past == 24
        assert not np.allclose(stale, first)


def test_prefill_materialises_only_the_final_chunk(gguf_f32):
    import llama_cpp as lc

    x = _embeds(20, seed=5)
    with Backbone(gguf_f32, EXACT) as backbone:  # n_batch 16: a chunk of 16, then one of 4
        # a chunk before the final one goes in with embeddings off and no row flagged
        backbone._decode(x[:16], want_output=False)
        assert not lc.llama_get_logits_ith(backbone._ctx, -1)
        assert not lc.llama_get_embeddings_ith(backbone._ctx, -1)
        backbone.reset()
        hidden, logits = backbone.prefill(x)
        assert hidden.shape == (256,) and logits.shape == (151936,)
        assert lc.llama_get_embeddings_ith(backbone._ctx, 3)  # the final chunk's 4 rows
        assert not lc.llama_get_embeddings_ith(backbone._ctx, 4)


@pytest.mark.parametrize("n_batch", [512, 16])
def test_prefill_is_bitwise_upstreams_chunked_feed(gguf_f16, n_batch):
    """Upstream's backend decodes the prompt in n_batch chunks with embeddings on (every
    row output); the last row's hidden state and logits must be exactly its bits."""
    x = _embeds(37, seed=6)
    settings = BackboneSettings(n_ctx=256, n_batch=n_batch, n_threads=1)
    with Backbone(gguf_f16, settings) as backbone:
        for start in range(0, 37, n_batch):
            backbone._decode(x[start : start + n_batch], want_output=True)
        want_hidden, want_logits = (a.copy() for a in backbone._outputs())
        backbone.reset()
        hidden, logits = backbone.prefill(x)
        np.testing.assert_array_equal(hidden, want_hidden)
        np.testing.assert_array_equal(logits, want_logits)
        assert backbone.n_past == 37


# ---------------------------------------------------------------- bad input


def test_prompt_longer_than_n_ctx(gguf_f32):
    settings = BackboneSettings(n_ctx=64, n_batch=16, n_threads=1)
    with Backbone(gguf_f32, settings) as backbone:
        with pytest.raises(InputError, match="n_ctx is 64"):
            backbone.prefill(_embeds(70))
        backbone.reset()
        backbone.prefill(_embeds(63))
        backbone.step(_embeds(1)[0])
        with pytest.raises(InputError, match="n_ctx"):
            backbone.step(_embeds(1)[0])


def test_missing_or_broken_gguf(tmp_path):
    with pytest.raises(InputError, match="not found"):
        Backbone(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(InputError, match="cannot load the backbone"):
        Backbone(bad)


def test_wrong_embedding_width(gguf_f32):
    with Backbone(gguf_f32, EXACT) as backbone:
        with pytest.raises(InputError, match="need"):
            backbone.prefill(np.zeros((4, 128), dtype=np.float32))
