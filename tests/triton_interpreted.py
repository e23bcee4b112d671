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
  dot that treats each row alike;
- an fp32 -> bf16 cast truncates the mantissa; a GPU (and torch) rounds to nearest even, which
  the patched cast does, so the kernels' accuracy is checked as it will be on the device.
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


def fused_against_torch() -> dict:
    """fused.py's kernels against the torch ops they replace: expert alignment and routing
    exactly, the combine bitwise (same fp32 order, same rounding)."""
    from tidal.kernels import fused, ops, routing

    torch.manual_seed(0)
    out = {}
    out["align_equal"] = all(
        all(torch.equal(a, b) for a, b in zip(routing.align_by_expert(ids, e, 64),
                                              fused.align_by_expert(ids, e, 64)))
        for ids, e in ((torch.randint(0, e, (a,)), e) for a, e in ((1, 8), (150, 8), (600, 5))))
    det, logits = ops.DeterministicOps(use_triton=False), torch.randn(13, 8)
    want_ids, want_gates = ops.unfused_route(det, logits, 2, True, None)
    ids, gates = fused.route(logits, 2, True, None)
    replayed, replay_gates = fused.route(logits, 2, True, want_ids.flip(-1))
    out["route_ids_equal"] = torch.equal(ids, want_ids) and torch.equal(replayed, want_ids.flip(-1))
    out["route_gate_err"] = float(max((gates - want_gates).abs().max(),
                                      (replay_gates - want_gates.flip(-1)).abs().max()))
    y, w, res = torch.randn(40, 48).bfloat16(), torch.rand(10, 4), torch.randn(10, 48).bfloat16()
    want = res + ops.ordered_sum((y.view(10, 4, -1).float() * w[..., None]).unbind(1)).bfloat16()
    out["combine_equal"] = torch.equal(fused.combine(y, w, res), want)
    return out


def main(what: str) -> dict | list:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    torch.set_num_threads(1)
    patch_interpreter()
    from tidal.kernels.ops import DeterministicOps

    ops = DeterministicOps(use_triton=True)
    if what == "checks":
        from tidal.kernels.checks import run_kernel_checks

        return run_kernel_checks("cpu", ops, small=True)
    if what == "fused":
        return fused_against_torch()
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
