"""Quantizing the backbone: llama.cpp's quantizer as the `llama-quantize` binary or libllama
in-process (llama), and the direct engine that quantizes straight from the checkpoint with
ggml (direct).

May import: source/, gguf/, disk/, native/ and the top level (errors, progress, report,
hold_points) (rank 4); never tts/ (beside it), nano/, verify/, doctor/, pipeline/ or cli/.
"""
