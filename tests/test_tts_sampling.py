"""Sampling: greedy, temperature, top-k, top-p boundary, repetition penalty, seeds."""

from __future__ import annotations

import numpy as np
import pytest

from moss_gguf_cli.errors import InputError, NumericError
from moss_gguf_cli.tts.sampling import (
    GREEDY_BELOW,
    Sampler,
    SamplingError,
    SamplingParams,
    apply_repetition_penalty,
    filter_probabilities,
    sample_rows,
    sample_token,
)


def _logits(probs) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def test_greedy_is_argmax_and_draws_nothing():
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert sample_token(logits.copy(), SamplingParams(temperature=0.0), rng) == 1
    assert sample_token(logits.copy(), SamplingParams(temperature=-1.0, top_k=1), rng) == 1
    assert rng.bit_generator.state == before
    rows = np.array([[0.0, 1.0, 0.5], [2.0, -1.0, 1.9]], dtype=np.float32)
    assert sample_rows(rows, SamplingParams(temperature=0.0), rng).tolist() == [1, 0]


def test_temperature_scales_the_distribution():
    logits = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    for temperature in (0.5, 1.0, 2.0):
        expected = np.exp(logits / temperature)
        expected /= expected.sum()
        got = filter_probabilities(logits, SamplingParams(temperature=temperature))
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    hot = filter_probabilities(logits, SamplingParams(temperature=4.0))
    cold = filter_probabilities(logits, SamplingParams(temperature=0.25))
    assert hot.max() < cold.max()


def test_top_k_keeps_the_k_largest():
    logits = np.array([0.0, 5.0, 1.0, 4.0, 3.0, -2.0], dtype=np.float32)
    probs = filter_probabilities(logits, SamplingParams(temperature=1.0, top_k=3))
    assert set(np.flatnonzero(probs)) == {1, 3, 4}
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-9)
    rng = np.random.default_rng(0)
    draws = {sample_token(logits.copy(), SamplingParams(1.0, top_k=2), rng) for _ in range(300)}
    assert draws == {1, 3}
    # top_k 0 or >= vocab means: no cut
    assert np.count_nonzero(filter_probabilities(logits, SamplingParams(1.0, top_k=0))) == 6
    assert np.count_nonzero(filter_probabilities(logits, SamplingParams(1.0, top_k=99))) == 6


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.45, {0}),  # token 0 alone crosses p: kept, nothing more
        (0.60, {0, 1}),  # 0.5 < p: token 1 crosses p and is kept
        (0.79, {0, 1}),
        (0.81, {0, 1, 2}),
        (1.00, {0, 1, 2, 3}),
    ],
)
def test_top_p_keeps_the_token_that_crosses_p(top_p, kept):
    logits = _logits([0.5, 0.3, 0.15, 0.05])
    probs = filter_probabilities(logits, SamplingParams(temperature=1.0, top_p=top_p))
    assert set(np.flatnonzero(probs)) == kept
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-9)


def test_top_k_then_top_p():
    logits = _logits([0.4, 0.3, 0.2, 0.1])
    # top-k 2 renormalises to 4/7, 3/7: with p 0.5 only the first remains
    probs = filter_probabilities(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    assert set(np.flatnonzero(probs)) == {0}
    probs = filter_probabilities(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.6))
    assert set(np.flatnonzero(probs)) == {0, 1}


def test_repetition_penalty_follows_hf():
    logits = np.array([2.0, -2.0, 1.0, -1.0], dtype=np.float32)
    seen = np.array([True, True, False, False])
    apply_repetition_penalty(logits, seen, 2.0)
    assert logits.tolist() == [1.0, -4.0, 1.0, -1.0]
    unchanged = np.array([2.0, -2.0], dtype=np.float32)
    apply_repetition_penalty(unchanged, np.array([True, True]), 1.0)
    assert unchanged.tolist() == [2.0, -2.0]
    # per row: each codebook only penalises its own history
    rows = np.array([[3.0, 2.9], [3.0, 2.9]], dtype=np.float32)
    seen_rows = np.array([[True, False], [False, False]])
    picks = sample_rows(rows, SamplingParams(0.0, repetition_penalty=1.2), None, seen_rows)
    assert picks.tolist() == [1, 0]


def test_seed_reproducibility():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 64)).astype(np.float32)
    params = SamplingParams(temperature=1.3, top_p=0.9, top_k=20)

    def run(seed):
        sampler = Sampler(params, params, seed=seed)
        return [sampler.audio(logits.copy()).tolist() for _ in range(20)]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_draws_follow_the_distribution():
    probs = np.array([0.6, 0.25, 0.1, 0.05])
    rng = np.random.default_rng(1234)
    rows = np.tile(_logits(probs), (20000, 1))
    picks = sample_rows(rows, SamplingParams(temperature=1.0), rng)
    freq = np.bincount(picks, minlength=4) / picks.size
    np.testing.assert_allclose(freq, probs, atol=0.015)


def test_minus_inf_is_never_drawn_and_all_minus_inf_is_an_error():
    rng = np.random.default_rng(3)
    logits = np.array([-np.inf, 0.0, -np.inf, 0.0], dtype=np.float32)
    draws = {sample_token(logits.copy(), SamplingParams(2.0), rng) for _ in range(200)}
    assert draws == {1, 3}
    with pytest.raises(NumericError):
        sample_token(np.full(4, -np.inf, dtype=np.float32), SamplingParams(1.0), rng)


def test_a_temperature_too_small_to_divide_by_is_greedy():
    """Issue #36: 1e-320 overflowed the division and left no finite logit, every step."""
    logits = _logits([0.2, 0.5, 0.3])
    for tiny in (1e-320, 5e-324, GREEDY_BELOW / 2, float("nan")):
        rng = np.random.default_rng(0)
        before = rng.bit_generator.state
        assert sample_token(logits.copy(), SamplingParams(temperature=tiny), rng) == 1
        assert rng.bit_generator.state == before
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy


def test_settings_that_leave_nothing_to_sample_name_themselves():
    """The request's settings are the request's fault (an InputError naming the setting);
    logits that were broken before them are the server's (NumericError)."""
    sampler = Sampler(SamplingParams(), SamplingParams(repetition_penalty=1e-39), seed=0)
    logits = np.full((2, 4), 3e38, dtype=np.float32)
    with pytest.raises(SamplingError) as caught:
        sampler.audio(logits, np.ones((2, 4), dtype=bool))
    assert caught.value.setting == "audio_repetition_penalty"
    assert isinstance(caught.value, InputError)
    # float32 logits cannot overflow a division by 1e-5 in float64; float64 ones can
    hot = Sampler(SamplingParams(temperature=1e-4), SamplingParams(), seed=0)
    with pytest.raises(SamplingError) as caught:
        hot.text(np.array([1e306, 0.0]))
    assert caught.value.setting == "text_temperature"
    broken = np.full(4, -np.inf, dtype=np.float32)
    with pytest.raises(NumericError) as caught:
        Sampler(SamplingParams(), SamplingParams(), seed=0).text(broken)
    assert not isinstance(caught.value, InputError)


def test_sample_one_is_sample_rows_for_one_row():
    """The one-row path MOSS-TTS-Nano samples with picks what sample_rows picks, for the same
    logits and generator state: penalties, ties, greedy, top-k, top-p."""
    from moss_gguf_cli.tts.sampling import sample_one

    source = np.random.default_rng(5)
    for trial in range(600):
        vocab = int(source.integers(2, 1100))
        logits = (source.standard_normal(vocab) * 3).astype(np.float32)
        if trial % 7 == 0:
            logits[source.integers(0, vocab, 5)] = logits.max()  # ties, broken by id
        seen = source.random(vocab) < 0.1
        params = SamplingParams(float(source.choice([0.0, 0.8, 1.5])),
                                float(source.choice([1.0, 0.95, 0.5])),
                                int(source.choice([0, 1, 25, 50])),
                                float(source.choice([1.0, 1.2])))  # fmt: skip
        seed = int(source.integers(0, 1000))
        one = sample_one(logits.copy(), params, np.random.default_rng(seed), seen)
        rows = sample_rows(logits.copy()[None], params, np.random.default_rng(seed), seen[None])
        assert one == int(rows[0]), (trial, params)
