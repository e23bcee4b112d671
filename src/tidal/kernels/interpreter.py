"""Triton's interpreter (``TRITON_INTERPRET=1``) made faithful to the compiled kernels, so the
kernels can be checked on a CPU (tests/test_kernels.py, the CPU rehearsal of
scripts/gpu_numerics.sh). Applied by ``tidal.kernels`` on import when the variable is set.

Four gaps of Triton 3.6's interpreter (not of the compiled kernels) are patched:
- a scalar loop bound is a 1-element array that numpy >= 2.3 refuses to turn into an int;
- tl.dot on bf16 multiplies the raw 16-bit patterns (numpy has no bf16);
- tl.dot is numpy's BLAS matmul of the tile, whose result for a row depends on where the row
  sits in the tile (micro-kernel edges). A GPU's MMA computes every row alike; here the tile's
  dot runs in float64 (bf16 products exact, the sum rounded once to fp32), which is row-position
  independent too. So these runs check the kernels' indexing, masks, K order and tiling, given a
  dot that treats each row alike;
- an fp32 -> bf16 cast truncates the mantissa; a GPU (and torch) rounds to nearest even, which
  the patched cast does, so the kernels' accuracy is checked as it will be on the device.
"""

from __future__ import annotations

import numpy as np

_PATCHED = False


def patch_interpreter() -> None:
    """Apply the patches (once per process)."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    import triton.language as tl
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patched_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16:
            return (h.data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return h.data.astype(np.float64)

    def patched_dot(self, a, b, d, *args):
        if not (a.dtype.is_floating() and d.dtype.scalar == tl.float32):
            return create_dot(self, a, b, d, *args)
        out = (np.matmul(widen(a), widen(b)) + d.data.astype(np.float64)).astype(np.float32)
        return interpreter.TensorHandle(out, d.dtype.scalar)

    convert_float = interpreter._convert_float

    def patched_convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16 and rounding_mode in (None, "rtne"):
            bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
            return rounded.astype(np.uint16)
        return convert_float(data, src, dst, rounding_mode)

    interpreter._convert_float = patched_convert
    interpreter._patch_lang_tensor = patched_tensor
    interpreter.InterpreterBuilder.create_dot = patched_dot

