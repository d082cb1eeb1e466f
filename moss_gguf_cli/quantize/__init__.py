"""Quantizing the backbone: llama.cpp's quantizer as the `llama-quantize` binary or libllama
in-process (llama), and the direct engine that quantizes straight from the checkpoint with
ggml (direct).

May import: gguf/, source/, tts/ (its own tier), disk/, native/ and the top level
(errors, progress, report, hold_points); never pipeline/, verify/, doctor/ or cli/.
"""
