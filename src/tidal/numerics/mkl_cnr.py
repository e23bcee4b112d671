"""MKL's strict conditional numerical reproducibility (CNR): matmuls whose bits do not depend on
the thread count.

Why: MKL's sgemm splits a long inner dimension (from ~1000 on) among threads, so 1 and 2 threads
add partial sums in different orders. In mid-training that is every weight gradient (the inner
dimension is batch x (seq_len - 1) = 4080 tokens in the default recipe): from one state, a step
at 1 and at 2 threads gave bit-equal forwards but gradients up to 6e-9 apart, and
run.pretrain_threads = 0 switches between the two by timing (pretrain.loop.ThreadTuner). In
strict mode (what MKL_CBWR=AUTO,STRICT asks for) the two are bit-equal.

Cost: a few percent of a mid-training step, but one-row matmuls (batch-1 decode) about twice as
slow (docs/numerics.md, "Reproducibility"). Hence only mid-training turns it on.

MKL fixes the mode at its first call in a process, so ``enable_strict`` works only before
anything has run a matmul: mid-training in a process of its own (`tidal train` spawns one,
`tidal pretrain` starts with it).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

_AUTO, _STRICT, _ALL = 2, 0x10000, -1
"""mkl_cbwr constants: MKL_CBWR_AUTO, MKL_CBWR_STRICT, MKL_CBWR_ALL (mkl_cbwr.h)."""


@functools.cache
def _mkl():
    """torch's statically linked MKL (its service functions are exported), or None."""
    import torch

    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        mkl = ctypes.CDLL(str(lib))
        mkl.mkl_serv_cbwr_get, mkl.mkl_serv_cbwr_set  # noqa: B018 (raise if absent)
    except (OSError, AttributeError):  # another platform's torch, or one built without MKL
        return None
    return mkl


def strict_active() -> bool:
    """Whether MKL runs in strict CNR mode in this process (False without MKL)."""
    mkl = _mkl()
    return mkl is not None and bool(mkl.mkl_serv_cbwr_get(_ALL) & _STRICT)


def enable_strict() -> bool:
    """Switch MKL to strict CNR mode if nothing has used MKL yet in this process (or it is on
    already: MKL_CBWR=AUTO,STRICT); returns whether it is on."""
    mkl = _mkl()
    if mkl is not None and not strict_active():
        mkl.mkl_serv_cbwr_set(_AUTO | _STRICT)  # refused (nonzero) once MKL has run
    return strict_active()
