"""The delay family (MOSS-TTS, MOSS-TTSD, MOSS-VoiceGenerator, MOSS-SoundEffect): its room
(docs/ARCHITECTURE.md §6, "The family interface").

    from moss_gguf_cli.delay import Synthesizer, SynthConfig

    with Synthesizer(SynthConfig.from_yaml("weights-demo/moss-tts.yaml")) as tts:
        waveform = tts.generate("Hello", seed=1)

Its runtime: config (the synth YAML; defaults in tts/defaults.py), prompt, pattern (the delay
pattern's state machine), embeddings, heads, text_head, engine (the batch engine: utterances
in KV sequences, stepped together), normalize and language (text rules), chunking (long text
split where a speaker breathes), speech (a request's chunks, one voice), synthesizer (the
loop), floor (the step's memory floor). synth.py: `synth` for its folders (the command's
options → tts/spoken's Spoken or Planned). serving.py: `serve` for its folders (serve_delay:
the config read, the Synthesizer loaded into the one serve core) and its request builder
(DelayRequests: language, MOSS-TTSD's voice per speaker, LoRA adapters); stepper.py:
DelayStepper, its requests' chunks as utterances in the batch engine's free sequences, a
runaway chunk run again; adapters.py: the LoRA adapter set a request names, one set a batch.
Its convert (`all`) is still the stage core's pipeline/ (to move here later).

May import: the stage cores (pipeline/, serve/: rank 6), verify/ and doctor/ (5), tts/,
quantize/, graphs/ (4), source/, gguf/, disk/, native/ and the top level (rank 7, a family's
room); only the registry (families/) imports it.
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
