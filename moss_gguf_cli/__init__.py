"""moss-gguf: MOSS-TTS checkpoints → llama.cpp GGUF backbone + NumPy tables."""

__version__ = "0.1.0"
