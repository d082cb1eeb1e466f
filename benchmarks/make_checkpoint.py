"""Write (once) the real-dims 2-layer MOSS-TTS checkpoint the benchmarks share.

    python benchmarks/make_checkpoint.py [DIR]     # default /tmp/moss-gguf-bench
"""

import sys
from pathlib import Path

from _common import DEFAULT_DIR, real_dims_checkpoint

if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR
    print(real_dims_checkpoint(root))
