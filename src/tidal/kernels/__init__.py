"""Batch-invariant Triton kernels (matmul.py, attention.py, rowwise.py, fused.py) and the GPU op
sets of the one fused forward (triton_ops.py: deterministic; fast_ops.py: plain torch).

Under ``TRITON_INTERPRET=1`` (Triton's interpreter: the kernels run on CPU tensors, for tests and
the GPU script's CPU rehearsal) interpreter.py's patches are applied on import, so the
interpreted kernels compute what the compiled ones do.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    from tidal.kernels.interpreter import patch_interpreter

    patch_interpreter()
