"""bfloat16 as a NumPy dtype (ml_dtypes'), imported on first use.

Importing ml_dtypes registers its casts with NumPy, which costs about half a second: a process
that never meets a bf16 value (a refusal, `--help`, `verify`, `serve`) should not pay it.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)
