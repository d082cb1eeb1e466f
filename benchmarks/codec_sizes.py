"""Sizes of the fork's codec GGUFs for a MOSS Audio Tokenizer config, from the config alone.

  python benchmarks/codec_sizes.py path/to/MOSS-Audio-Tokenizer/config.json

Parameter counts × bytes per value (f16: 2, 1-D tensors and f32: 4), per file; the GGUF
header (keys and tensor infos, some tens of KB) comes on top. docs/audio-codec.md quotes it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from moss_gguf_cli.source.audio_tokenizer_checkpoint import expected_shapes
from moss_gguf_cli.source.codec_plan import part_sizes


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    shapes = expected_shapes(config)
    total = sum(math.prod(s) for s in shapes.values())
    print(
        f"checkpoint: {len(shapes)} tensors, {total:,} parameters, {total * 4 / 1e9:.2f} GB at f32"
    )
    for part, size in part_sizes(config).items():
        print(
            f"{part}: {size.tensors} tensors, {size.params:,} parameters, "
            f"f16 {size.f16_bytes / 1e9:.2f} GB, f32 {size.f32_bytes / 1e9:.2f} GB"
        )


if __name__ == "__main__":
    main(sys.argv[1])
