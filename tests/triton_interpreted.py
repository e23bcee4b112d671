"""Run tidal's Triton kernels through Triton's interpreter on CPU tensors; print JSON.

    TRITON_INTERPRET=1 python tests/triton_interpreted.py checks|model

Started by tests/test_kernels.py in a fresh process, because TRITON_INTERPRET must be set
before triton is first imported. ``checks``: the device kernel checks at small sizes; ``model``:
a tiny bf16 MoE through the engine and trainer paths, deterministic mode on the kernels.

Three gaps of Triton 3.6's interpreter (not of the compiled kernels) are patched first:
- a scalar loop bound is a 1-element array that numpy >= 2.3 refuses to turn into an int;
- tl.dot on bf16 multiplies the raw 16-bit patterns (numpy has no bf16);
- tl.dot is numpy's BLAS matmul of the tile, whose result for a row depends on where the row
  sits in the tile (micro-kernel edges). A GPU's MMA computes every row alike; here the tile's
  dot runs in float64 (bf16 products exact, the sum rounded once to fp32), which is row-position
  independent too. So these runs check the kernels' indexing, masks, K order and tiling, given a
  dot that treats each row alike.
"""

import json
import os
import sys

import numpy as np
import torch


def patch_interpreter() -> None:
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

    interpreter._patch_lang_tensor = patched_tensor
    interpreter.InterpreterBuilder.create_dot = patched_dot


def main(what: str) -> dict | list:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    torch.set_num_threads(1)
    patch_interpreter()
    from tidal.kernels.ops import DeterministicOps

    ops = DeterministicOps(use_triton=True)
    if what == "checks":
        from tidal.kernels.checks import run_kernel_checks

        return run_kernel_checks("cpu", ops, small=True)
    from tidal.bench.numerics_gpu import Workload, make_prompts, run_mode
    from tidal.kernels.moe_model import SIZES, MoEModel

    shape = SIZES["tiny"]
    model = MoEModel.random(shape, "cpu", torch.bfloat16, seed=2)
    spec = make_prompts(Workload((3, 1), (3, 7), (3, 7)), shape.vocab_size, 0)
    result: dict = {}
    run_mode(model, ops, spec, 0, lambda: None, result)
    return result["deterministic"]


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
