"""What a model family says, so that no stage asks which family it holds (docs/ARCHITECTURE.md
§6 "The family interface"). Step 1 of #61: each member points at the family's code where it
is today; steps 2 and 3 move that code home and add the Voice the serve core steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Family:
    """One model family: its name, what it claims, and its entry into each stage."""

    name: str  # its folders' manifest format and synth config's `family`
    title: str  # the name users read
    builtin: str  # the tiny checkpoint it makes offline (`builtin:…`): tests and first runs
    synth_config: str  # the synth config `all` writes into its folder
    audio_tokenizer: str  # the codec `all` takes when --audio-tokenizer is not given
    claims_input: Callable[[str], bool]  # --model: a folder's config, a Hub id, a builtin
    claims_folder: Callable[[Path], bool]  # a folder it wrote (its manifest)
    # `all`: (AllRequest, progress) → the result the CLI renders (by its type)
    convert: Callable[..., Any]
    # `verify`: (target, source, deep, progress, record) → VerifyReport
    verify: Callable[..., Any]
    # `synth`: (its synth config's path, the command's options by name, progress) →
    # tts/spoken.Spoken (or Planned, --dry-run); the options it does not take refused by name
    synth: Callable[..., Any]
    # `serve`: ServeSettings → serve.server.Served (the serve extra loads only here)
    serve: Callable[[Any], Any]
    publishes: bool = True  # `all --push-to-hub` can publish its folder
