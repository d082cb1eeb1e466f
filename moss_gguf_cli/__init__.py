"""moss-gguf: MOSS-TTS checkpoints → llama.cpp GGUF backbone + NumPy tables."""

__version__ = "0.1.0"

from . import hold_points as _holds  # noqa: E402,F401 - takes MOSS_GGUF_HOLD before any child starts
