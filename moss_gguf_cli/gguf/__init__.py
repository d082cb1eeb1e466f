"""GGUF format code: read a GGUF's header (read), plan and write the f16/bf16 backbone GGUF
(write: metadata, tensor order; vocab: the tokenizer keys; stream: tensor data read, rounded and
written in chunks), importance matrices (imatrix), Qwen3's tensor-name table (qwen3_names),
and the first-class moss-tts-delay GGUF of OpenMOSS's llama.cpp fork (delay: its facts and
plan; delay_read: its header check).

May import: source/, tts/, quantize/ (its own tier), disk/, native/ and the top level
(errors, progress, report, hold_points); never pipeline/, verify/, doctor/ or cli/.
"""
