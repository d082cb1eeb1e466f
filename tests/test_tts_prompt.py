"""Prompt text and rows: ids, shape S × (1 + n_vq), reference codes in delay pattern; equal to
upstream's processor id for id (tests/data/upstream_prompts.json, made once by
scripts/upstream_text_rules.py from upstream's MossTTSDelayProcessor at the commit it names)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moss_gguf_cli.delay.config import ModelInfo
from moss_gguf_cli.delay.normalize import merge_turns, normalize_dialogue, normalize_text
from moss_gguf_cli.delay.prompt import PromptFields, build_prompt, dialogue_text, load_tokenizer
from moss_gguf_cli.errors import InputError
from moss_gguf_cli.source.tiny import tokenizer_source

GOLDEN = json.loads(
    (Path(__file__).parent / "data" / "upstream_prompts.json").read_text(encoding="utf-8")
)

INFO = ModelInfo()  # MOSS-TTS: n_vq 32, pad code 1024, the real special ids
EXPECTED_TEXT = (
    "<|im_start|>user\n"
    "<user_inst>\n"
    "- Reference(s):\nNone\n"
    "- Instruction:\nNone\n"
    "- Tokens:\nNone\n"
    "- Quality:\nNone\n"
    "- Sound Event:\nNone\n"
    "- Ambient Sound:\nNone\n"
    "- Language:\nNone\n"
    "- Text:\nHello\n"
    "</user_inst><|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(tokenizer_source())


def test_known_text_rows(tokenizer):
    prompt = build_prompt(tokenizer, INFO, PromptFields(text="Hello"))
    assert prompt.text == EXPECTED_TEXT
    ids = prompt.rows[:, 0].tolist()
    assert ids == tokenizer.encode(EXPECTED_TEXT, add_special_tokens=False).ids + [151652]
    assert ids[:3] == [151644, 872, 198]  # <|im_start|> user \n
    assert 9707 in ids  # "Hello"
    # <|im_end|> \n <|im_start|> assistant \n <audio-start>
    assert ids[-6:] == [151645, 198, 151644, 77091, 198, 151652]
    assert prompt.rows.shape == (len(ids), 33)
    assert prompt.rows.dtype == np.int64
    assert (prompt.rows[:, 1:] == 1024).all()
    assert prompt.reference_frames == 0


def test_fields_are_written_in_place(tokenizer):
    fields = PromptFields(
        text="Hi.",
        instruction="whisper",
        tokens=120,
        quality="high",
        sound_event="rain",
        ambient_sound="cafe",
        language="en",
    )
    text = build_prompt(tokenizer, INFO, fields).text
    for piece in (
        "- Instruction:\nwhisper\n",
        "- Tokens:\n120\n",
        "- Quality:\nhigh\n",
        "- Sound Event:\nrain\n",
        "- Ambient Sound:\ncafe\n",
        "- Language:\nen\n",
        "- Text:\nHi.\n</user_inst>",
    ):
        assert piece in text


def test_reference_block_in_delay_pattern(tokenizer):
    frames, n_vq = 5, INFO.n_vq
    codes = np.random.default_rng(0).integers(0, 1024, size=(frames, n_vq))
    prompt = build_prompt(tokenizer, INFO, PromptFields(text="Hello"), codes)
    rows, ids = prompt.rows, prompt.rows[:, 0]
    assert prompt.reference_frames == frames
    assert "- Reference(s):\n[S1]:\n<|vision_start|>" in prompt.text
    starts = np.flatnonzero(ids == INFO.audio_start_token_id)
    assert len(starts) == 2 and starts[1] == len(ids) - 1  # reference block + final start
    a = int(starts[0])
    span = frames + n_vq - 1
    assert (ids[a + 1 : a + 1 + span] == INFO.audio_user_slot_token_id).all()
    assert ids[a + 1 + span] == INFO.audio_end_token_id
    assert np.count_nonzero(ids == INFO.audio_user_slot_token_id) == span
    # codebook k of frame t sits on slot row t + k
    for t in range(frames):
        for k in range(n_vq):
            assert rows[a + 1 + t + k, 1 + k] == codes[t, k]
    block = rows[a + 1 : a + 1 + span, 1:]
    assert np.count_nonzero(block != 1024) == frames * n_vq
    outside = np.ones(len(ids), dtype=bool)
    outside[a + 1 : a + 1 + span] = False
    assert (rows[outside, 1:] == 1024).all()
    # the text column equals a plain encode of the prompt text
    expected = tokenizer.encode(prompt.text, add_special_tokens=False).ids + [151652]
    assert ids.tolist() == expected


def test_n_vq_16_reference(tokenizer):
    info = ModelInfo(n_vq=16)
    codes = np.ones((3, 16), dtype=np.int64)
    prompt = build_prompt(tokenizer, info, PromptFields(text="Hi"), codes)
    assert prompt.rows.shape[1] == 17
    assert np.count_nonzero(prompt.rows[:, 0] == info.audio_user_slot_token_id) == 3 + 15


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_text_is_refused(tokenizer, text):
    with pytest.raises(InputError, match="empty"):
        build_prompt(tokenizer, INFO, PromptFields(text=text))


def test_control_tokens_in_text_are_refused(tokenizer):
    with pytest.raises(InputError, match="special token"):
        build_prompt(tokenizer, INFO, PromptFields(text="hi <|im_end|> there"))


def test_reference_codes_of_the_wrong_shape(tokenizer):
    with pytest.raises(InputError, match="expected"):
        build_prompt(tokenizer, INFO, PromptFields(text="Hi"), np.zeros((4, 8), dtype=np.int64))
    with pytest.raises(InputError, match="codebook"):
        build_prompt(tokenizer, INFO, PromptFields(text="Hi"), np.full((4, 32), 1024))


def test_tokenizer_without_the_special_ids(tokenizer):
    info = ModelInfo(audio_start_token_id=10_000_000)
    with pytest.raises(InputError, match="no token with id 10000000"):
        build_prompt(tokenizer, info, PromptFields(text="Hi"))


# ---------------------------------------------------------------- upstream's processor, id for id


def _codes(listed):
    return None if listed is None else np.asarray(listed, dtype=np.int64)


def _ours(tokenizer, case: dict):
    """Our prompt for a golden case, from the same inputs upstream's processor got."""
    fields = dict(case["fields"])
    n_vq = len(case["input_ids"][0]) - 1
    if case["model"] == "MOSS-TTSD":
        text = dialogue_text(fields.pop("text"), fields.pop("speaker_texts", ()))
        assert text == fields.pop("text_as_sent")  # the TTSD app's text, built as it builds it
        fields["text"] = text
    text = fields.pop("text")
    fields = PromptFields(text=None if text is None else normalize_text(text), **fields)
    speakers = case["speakers"]
    return build_prompt(
        tokenizer,
        ModelInfo(n_vq=n_vq),
        fields,
        speakers=None if speakers is None else [_codes(c) for c in speakers],
        continuation=_codes(case["continuation"]),
    )


def test_golden_data_covers_the_four_model_kinds() -> None:
    assert len(GOLDEN["commit"]) == 40 and "upstream_text_rules.py" in GOLDEN["command"]
    models = {case["model"] for case in GOLDEN["cases"]}
    assert models == {"MOSS-TTS", "MOSS-TTSD", "MOSS-VoiceGenerator", "MOSS-SoundEffect"}
    ttsd = [c for c in GOLDEN["cases"] if c["name"] == "ttsd_two_speakers_cloned"][0]
    assert len(ttsd["speakers"]) == 2 and ttsd["mode"] == "continuation"


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[c["name"] for c in GOLDEN["cases"]])
def test_equals_upstreams_processor(tokenizer, case: dict) -> None:
    prompt = _ours(tokenizer, case)
    expected = np.asarray(case["input_ids"], dtype=np.int64)
    if case["mode"] == "generation":
        # upstream's model adds the audio-start itself; ours is in the prompt
        assert prompt.rows[-1, 0] == INFO.audio_start_token_id
        assert (prompt.rows[-1, 1:] == INFO.audio_pad_code).all()
        np.testing.assert_array_equal(prompt.rows[:-1], expected)
    else:
        np.testing.assert_array_equal(prompt.rows, expected)
        assert prompt.continuation_frames == len(case["continuation"])


@pytest.mark.parametrize("case", GOLDEN["dialogue_text"], ids=lambda c: c["input"][:20])
def test_dialogue_cleaning_equals_upstreams_app(case: dict) -> None:
    assert normalize_dialogue(case["input"]) == case["normalize_text"]
    assert merge_turns(case["input"]) == case["merged"]


def test_sound_effect_text_may_be_absent_with_an_ambient_sound(tokenizer) -> None:
    prompt = build_prompt(tokenizer, INFO, PromptFields(text=None, ambient_sound="rain"))
    assert "- Ambient Sound:\nrain\n" in prompt.text and "- Text:\nNone\n" in prompt.text
    with pytest.raises(InputError, match="empty"):
        build_prompt(tokenizer, INFO, PromptFields(text=None))


def test_a_dialogue_without_tags_is_refused() -> None:
    with pytest.raises(InputError, match="speaker tags"):
        dialogue_text("Hello there, no tags.")
    with pytest.raises(InputError, match="transcript of speaker S2"):
        dialogue_text("[S1] Hi [S2] Yo", ["[S1] a", "  "])


def test_speakers_without_a_clip_are_left_out(tokenizer) -> None:
    info = ModelInfo(n_vq=16)
    codes = np.ones((3, 16), dtype=np.int64)
    prompt = build_prompt(tokenizer, info, PromptFields(text="[S1]a[S2]b"), speakers=[None, codes])
    assert "- Reference(s):\n[S2]:\n" in prompt.text and "[S1]:" not in prompt.text
    assert prompt.reference_frames == 3
