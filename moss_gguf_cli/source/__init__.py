"""What comes in: the MOSS checkpoint (checkpoint, safetensors_io), the Hugging Face Hub (hub),
pre-converted MOSS-TTS-GGUF repos (preconverted), the audio tokenizer a folder speaks with
(audio_tokenizer), the special token ids (token_ids) and the tiny builtin model and codec
tests and `builtin:tiny` run on (tiny, tiny_codec).

May import: gguf/, quantize/, tts/ (its own tier), disk/, native/ and the top level
(errors, progress, report, hold_points); never pipeline/, verify/, doctor/ or cli/.
"""
