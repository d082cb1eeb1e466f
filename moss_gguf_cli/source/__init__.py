"""What comes in: the MOSS checkpoint (checkpoint, safetensors_io), a torch.save state dict read
without torch or its pickle code (torch_pickle), the Hugging Face Hub (hub),
pre-converted MOSS-TTS-GGUF repos (preconverted), the audio tokenizer a folder speaks with
(audio_tokenizer; the contract its ONNX graphs keep: codec_contract), a checkpoint planned
as the first-class moss-tts-delay GGUF (first_class), the special token ids (token_ids) and
the tiny builtin model and codec tests and `builtin:tiny` run on (tiny, tiny_codec). What is
one family's alone lives in its room (MOSS-TTS-Nano's codec: nano/codec_folder, nano/tiny_codec).

May import: gguf/, disk/, native/ and the top level (errors, progress, report, hold_points) (rank
3); never tts/, quantize/ or any room above.
"""
