"""Speaking with the converted weights: `Synthesizer` (text → 24 kHz waveform).

from moss_gguf_cli.tts import Synthesizer, SynthConfig

with Synthesizer(SynthConfig.from_yaml("weights-demo/moss-tts.yaml")) as tts:
    waveform = tts.generate("Hello", seed=1)
"""

from .config import ModelInfo, SynthConfig
from .synthesizer import Synthesizer, SynthProfile, SynthResult, synth_to_wav, write_wav

__all__ = [
    "ModelInfo",
    "SynthConfig",
    "SynthProfile",
    "SynthResult",
    "Synthesizer",
    "synth_to_wav",
    "write_wav",
]
