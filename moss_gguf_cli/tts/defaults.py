"""The synth settings every weights folder starts from: one source for layout and synth.

``layout`` writes these into each ``moss-tts.yaml``; ``delay.config.SynthConfig`` takes them as
its defaults; ``configs/llama_cpp/default.yaml`` holds the same values (a test keeps the three
in step). They are upstream's ``configs/llama_cpp/default.yaml`` values, so a folder made here
behaves like upstream's backend, but for float16 audio heads (docs/memory-floor.md): flash
attention where llama.cpp supports it, 3072 new tokens (about four minutes of audio), four
threads.
"""

from __future__ import annotations

from typing import Any

SYNTH_DEFAULTS: dict[str, Any] = {
    "audio_backend": "onnx",
    "heads_backend": "auto",  # float16 heads in ggml (docs/memory-floor.md); numpy: float32
    "n_ctx": 4096,
    "n_batch": 512,
    "n_threads": 0,  # the physical cores (docs/memory-floor.md: 4 threads on 2 cores was slower)
    "n_gpu_layers": -1,  # every layer when llama.cpp has a GPU backend; nothing on CPU builds
    "max_new_tokens": 3072,
    "use_gpu_audio": True,  # onnxruntime's CUDA provider when it is installed, else the CPU
    "kv_cache_type_k": "f16",
    "kv_cache_type_v": "f16",
    "flash_attn": "auto",
    "text_temperature": 1.5,
    "text_top_p": 1.0,
    "text_top_k": 50,
    "audio_temperature": 1.7,
    "audio_top_p": 0.8,
    "audio_top_k": 25,
    "audio_repetition_penalty": 1.0,
}

# how many rows a served batch step decodes (--batch-width; delay/engine.EngineSettings.width)
WIDTHS = ("served", "identical", "fixed")
