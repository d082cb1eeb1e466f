"""Speaking with the converted weights: `Synthesizer` (text → 24 kHz waveform).

from moss_gguf_cli.tts import Synthesizer, SynthConfig

with Synthesizer(SynthConfig.from_yaml("weights-demo/moss-tts.yaml")) as tts:
    waveform = tts.generate("Hello", seed=1)

Holds: config (the synth YAML; defaults in defaults.py), prompt, delay (the delay pattern's
state machine), sampling, embeddings, heads, backbone (llama.cpp), codec (the ONNX audio
tokenizer), normalize and language (text rules), synthesizer (the loop), streaming
(windowed decoding while it speaks), chunking (long text split where a speaker breathes),
speech (a request's chunks, one voice).

May import: source/, gguf/, disk/, native/ and the top level (errors, progress, report,
hold_points) (rank 4); never quantize/ (beside it), nano/, verify/, doctor/, pipeline/ or cli/.
"""

from .config import ModelInfo, SynthConfig
from .synthesizer import (
    Speaker,
    Synthesizer,
    SynthProfile,
    SynthResult,
    plan_text,
    synth_stream,
    synth_to_wav,
    write_wav,
)

__all__ = [
    "ModelInfo",
    "Speaker",
    "SynthConfig",
    "SynthProfile",
    "SynthResult",
    "Synthesizer",
    "plan_text",
    "synth_stream",
    "synth_to_wav",
    "write_wav",
]
