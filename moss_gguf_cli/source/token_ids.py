"""The special token ids of MOSS-TTS's Qwen3 tokenizer (docs/ARCHITECTURE.md §2).

Used only when a config lacks the key (source/checkpoint.py), and written into builtin:tiny's
config (source/tiny.py).
"""

TOKEN_DEFAULTS = {
    "pad_token_id": 151643,
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "audio_start_token_id": 151652,
    "audio_end_token_id": 151653,
    "audio_user_slot_token_id": 151654,
    "audio_assistant_gen_slot_token_id": 151656,
    "audio_assistant_delay_slot_token_id": 151662,
}
