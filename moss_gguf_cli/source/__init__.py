"""What comes in: the MOSS checkpoint (checkpoint, safetensors_io), a torch.save state dict read
without torch or its pickle code (torch_pickle), the Hugging Face Hub (hub),
pre-converted MOSS-TTS-GGUF repos (preconverted), the audio tokenizer a folder speaks with
(audio_tokenizer; the contract its ONNX graphs keep: codec_contract), a checkpoint planned
as the first-class moss-tts-delay GGUF (first_class), the special token ids (token_ids) and
the tiny builtin model and codec tests and `builtin:tiny` run on (tiny, tiny_codec), the
MOSS-TTS-Nano codec's ONNX release checked and its streaming state (nano_codec) and a tiny one
in its layout (tiny_nano_codec).

May import: gguf/, disk/, native/ and the top level (errors, progress, report, hold_points) (rank
3); never tts/, quantize/ or any room above.
"""
