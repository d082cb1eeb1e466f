"""Write (once) a real-dims MOSS-TTS checkpoint the benchmarks share.

    python benchmarks/make_checkpoint.py [--layers 36] [DIR]     # default DIR /tmp/moss-gguf-bench
"""

import argparse
from pathlib import Path

from _common import DEFAULT_DIR, real_dims_checkpoint

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--layers", type=int, default=2, help="2 (default) or 36: the real model")
    args = parser.parse_args()
    print(real_dims_checkpoint(args.dir, args.layers))
