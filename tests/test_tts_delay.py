"""The delay pattern and the generation state machine, driven by scripted logits."""

from __future__ import annotations

import numpy as np

from moss_gguf_cli.delay.config import ModelInfo
from moss_gguf_cli.delay.pattern import (
    DelayMachine,
    apply_delay,
    generated_segments,
    split_segments,
    undo_delay,
)
from moss_gguf_cli.tts.sampling import Sampler, SamplingParams

# a small vocabulary keeps the scripts readable; the machine only knows the ids
INFO = ModelInfo(
    n_vq=4,
    audio_vocab_size=8,
    audio_pad_code=8,
    pad_token_id=0,
    im_start_token_id=1,
    im_end_token_id=2,
    audio_start_token_id=3,
    audio_end_token_id=4,
    audio_user_slot_token_id=5,
    audio_assistant_gen_slot_token_id=6,
    audio_assistant_delay_slot_token_id=7,
)
PAD, IM_END, START, END, GEN, DELAY = 0, 2, 3, 4, 6, 7
VOCAB = 16
CODE_PAD = INFO.audio_pad_code
GREEDY = Sampler(SamplingParams(0.0), SamplingParams(0.0), seed=0)


def prompt(last: int = START) -> np.ndarray:
    rows = np.full((5, 1 + INFO.n_vq), CODE_PAD, dtype=np.int64)
    rows[:, 0] = [1, 9, 10, 11, last]
    return rows


def text_logits(*preferred: int) -> np.ndarray:
    """Logits preferring PREFERRED in order (first = highest)."""
    logits = np.zeros(VOCAB, dtype=np.float32)
    for rank, token in enumerate(preferred):
        logits[token] = 10.0 - rank
    return logits


def audio_logits(code: int = 1) -> np.ndarray:
    logits = np.zeros((INFO.n_vq, INFO.audio_rows), dtype=np.float32)
    logits[:, code] = 5.0
    logits[:, CODE_PAD] = 50.0  # the pad code must never win
    return logits


def sampled(row: np.ndarray) -> list[int]:
    return [k for k in range(INFO.n_vq) if row[1 + k] != CODE_PAD]


def test_delay_pattern_roundtrip():
    codes = np.arange(3 * 4).reshape(3, 4)
    rows = apply_delay(codes, 99)
    assert rows.shape == (3 + 4 - 1, 4)
    for k in range(4):
        assert rows[k : k + 3, k].tolist() == codes[:, k].tolist()
        assert (rows[:k, k] == 99).all() and (rows[k + 3 :, k] == 99).all()
    np.testing.assert_array_equal(undo_delay(rows, 99), codes)
    assert undo_delay(rows[:2], 99).shape == (0, 4)


def test_segments_drop_pad_frames_and_split():
    codes = np.array([[1, 1], [9, 9], [2, 2], [3, 9], [9, 9], [9, 9], [4, 4]])
    segments = split_segments(codes, 9)
    assert [s.tolist() for s in segments] == [[[1, 1]], [[2, 2], [3, 9]], [[4, 4]]]
    assert split_segments(np.full((3, 2), 9), 9) == []


def test_step0_inside_audio_forbids_delay_and_samples_codebook_0_only():
    machine = DelayMachine(INFO, prompt())
    assert machine.state.is_audio and machine.state.audio_length == 1
    row = machine.step(text_logits(DELAY, IM_END, GEN), audio_logits(), GREEDY)
    assert row[0] == GEN
    assert sampled(row) == [0] and row[1] == 1  # pad column was highest but never chosen


def test_ramp_up_and_inside_audio_mask():
    machine = DelayMachine(INFO, prompt())
    machine.step(text_logits(GEN), audio_logits(), GREEDY)
    # inside audio only gen/delay are allowed; <|im_end|>, pad and text ids lose
    row = machine.step(text_logits(IM_END, 12, PAD, END, GEN, DELAY), audio_logits(), GREEDY)
    assert row[0] == GEN and sampled(row) == [0, 1]
    row = machine.step(text_logits(12, DELAY, GEN), audio_logits(), GREEDY)
    assert row[0] == DELAY and sampled(row) == [0, 1, 2]


def test_delay_slot_run_then_audio_end():
    machine = DelayMachine(INFO, prompt())
    for _ in range(5):
        row = machine.step(text_logits(GEN), audio_logits(2), GREEDY)
    assert sampled(row) == [0, 1, 2, 3]
    row = machine.step(text_logits(DELAY), audio_logits(2), GREEDY)  # the first delay slot
    assert row[0] == DELAY and sampled(row) == [0, 1, 2, 3]
    assert machine.state.delayed_length == 1
    # the next n_vq - 1 steps are forced delay slots, whatever the logits say;
    # codebook k stops once the run passes it
    for j in range(1, INFO.n_vq):
        row = machine.step(text_logits(GEN, IM_END), audio_logits(2), GREEDY)
        assert row[0] == DELAY
        assert sampled(row) == list(range(j, INFO.n_vq))
    row = machine.step(text_logits(GEN), audio_logits(2), GREEDY)
    assert row[0] == END and sampled(row) == []
    assert not machine.state.is_audio
    assert machine.state.audio_length == 0 and machine.state.delayed_length is None


def _run_until_outside(machine: DelayMachine) -> list[np.ndarray]:
    rows = [machine.step(text_logits(GEN), audio_logits(3), GREEDY) for _ in range(2)]
    rows.append(machine.step(text_logits(DELAY), audio_logits(3), GREEDY))
    while machine.state.is_audio:
        rows.append(machine.step(text_logits(GEN), audio_logits(3), GREEDY))
    return rows


def test_outside_audio_masks_and_stop():
    machine = DelayMachine(INFO, prompt())
    rows = _run_until_outside(machine)
    assert rows[-1][0] == END
    # outside audio: pad, gen-slot, delay-slot and audio-end are never sampled
    row = machine.step(text_logits(PAD, GEN, DELAY, END, 12), audio_logits(), GREEDY)
    assert row[0] == 12 and sampled(row) == []
    assert machine.state.time_step == len(rows) + 1 and machine.state.time_step > INFO.n_vq
    row = machine.step(text_logits(IM_END, 12), audio_logits(), GREEDY)
    assert row[0] == IM_END and machine.done
    rows.extend([row])
    # three frames of code 3, sampled before the delay run ended
    segments = generated_segments(np.array(rows), INFO)
    assert len(segments) == 1
    np.testing.assert_array_equal(segments[0], np.full((3, INFO.n_vq), 3))


def test_im_end_is_forbidden_until_step_n_vq():
    machine = DelayMachine(INFO, prompt(last=11))  # a prompt ending outside audio
    assert not machine.state.is_audio and machine.state.audio_length == 0
    for _ in range(INFO.n_vq + 1):  # time steps 0 .. n_vq
        row = machine.step(text_logits(IM_END, 12), audio_logits(), GREEDY)
        assert row[0] == 12 and sampled(row) == [] and not machine.done
    row = machine.step(text_logits(IM_END, 12), audio_logits(), GREEDY)
    assert row[0] == IM_END and machine.done


def test_delay_slot_forbidden_at_step0_outside_audio():
    machine = DelayMachine(INFO, prompt(last=11))
    row = machine.step(text_logits(DELAY, 13), audio_logits(), GREEDY)
    assert row[0] == 13


def test_audio_start_enters_audio():
    machine = DelayMachine(INFO, prompt(last=11))
    row = machine.step(text_logits(START), audio_logits(), GREEDY)
    assert row[0] == START and sampled(row) == []
    assert machine.state.is_audio and machine.state.audio_length == 1
    row = machine.step(text_logits(GEN), audio_logits(), GREEDY)
    assert row[0] == GEN and sampled(row) == [0]


def test_plan_needs_audio_only_when_sampling():
    machine = DelayMachine(INFO, prompt(last=11))
    calls = []

    def heads(start, stop):
        calls.append((start, stop))
        return audio_logits()[start:stop].copy()

    machine.step(text_logits(12), heads, GREEDY)
    assert calls == []
    machine = DelayMachine(INFO, prompt())
    machine.step(text_logits(GEN), heads, GREEDY)
    machine.step(text_logits(GEN), heads, GREEDY)
    assert calls == [(0, 1), (0, 2)]


def test_repetition_penalty_uses_each_codebooks_history():
    rows = prompt()
    rows[1, 1:] = [5, 6, 7, 0]  # codebook k saw code rows[1, 1 + k] in the prompt
    machine = DelayMachine(INFO, rows)
    assert machine.seen[0, 5] and not machine.seen[1, 5]
    sampler = Sampler(SamplingParams(0.0), SamplingParams(0.0, repetition_penalty=4.0), seed=0)
    logits = np.zeros((INFO.n_vq, INFO.audio_rows), dtype=np.float32)
    logits[:, 5] = 2.0  # best, but already seen by codebook 0
    logits[:, 1] = 1.0
    row = machine.step(text_logits(GEN), logits, sampler)
    assert row[1] == 1
    assert machine.seen[0, 1]  # and the new code joins the history


def test_seeded_steps_are_reproducible():
    def run(seed):
        sampler = Sampler(SamplingParams(1.0), SamplingParams(1.5, 0.9, 5), seed=seed)
        machine = DelayMachine(INFO, prompt())
        rng = np.random.default_rng(99)
        out = []
        for _ in range(12):
            logits = rng.standard_normal(VOCAB).astype(np.float32)
            heads = rng.standard_normal((INFO.n_vq, INFO.audio_rows)).astype(np.float32)
            out.append(machine.step(logits, heads, sampler).tolist())
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_repetition_penalty_history_is_upstreams():
    """Codebook 0 by its own history; the others of the step by the union of theirs."""
    from moss_gguf_cli.delay.pattern import penalty_history
    from moss_gguf_cli.tts.sampling import SamplingParams, sample_rows

    seen = np.zeros((4, 6), dtype=bool)
    seen[0, 1] = True  # codebook 0 has used code 1
    seen[1, 2] = True  # codebook 1 has used code 2
    seen[3, 4] = True  # codebook 3 has used code 4
    h = penalty_history(seen, 0, 4)
    assert h[0].tolist() == [False, True, False, False, False, False]
    for k in (1, 2, 3):  # codebook 2 never used a code, and is still penalised on 2 and 4
        assert h[k].tolist() == [False, False, True, False, True, False]
    # during the delay ramp only the sampled codebooks' histories count
    assert penalty_history(seen, 2, 4).tolist() == [[False] * 4 + [True, False]] * 2
    assert penalty_history(seen, 0, 2)[1].tolist() == [False, False, True, False, False, False]

    # worked by hand, greedy with penalty 2.0: row 0's code 1 (3.0 → 1.5) loses to code 0
    # (2.0); row 1's code 2 (3.0 → 1.5) and code 4 (−1 → −2) drop, so code 3 (2.5) wins
    logits = np.array(
        [[2.0, 3.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 2.5, -1.0, 0.0]], dtype=np.float32
    )
    params = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=2.0)
    codes = sample_rows(logits, params, np.random.default_rng(0), penalty_history(seen, 0, 2))
    assert codes.tolist() == [0, 3]
