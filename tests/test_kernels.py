"""Batch-invariant kernels (tidal.kernels) and the numerics-gpu benchmark, on the CPU.

The pure-torch reference ops run everywhere. The Triton kernels run here through Triton's
interpreter (TRITON_INTERPRET=1, CPU tensors) when triton is installed; on a GPU machine the
same kernels are compiled and checked by ``scripts/gpu_numerics.sh``.
"""

import importlib.util
import os

import pytest
import torch

from tidal.bench.numerics_gpu import (WORKLOADS, Workload, make_prompts, run_mode, run_numerics,
                                      trainer_pass, generate_wave)
from tidal.kernels import reference
from tidal.kernels.checks import run_kernel_checks
from tidal.kernels.moe_model import SIZES, MoEModel
from tidal.kernels.ops import DeterministicOps, FastOps

HAVE_TRITON = importlib.util.find_spec("triton") is not None
NO_SYNC = lambda: None  # noqa: E731  (CPU: nothing to wait for)


def test_tree_sum_gives_a_row_the_same_bits_in_any_batch():
    x = torch.randn(37, 1000)
    full = reference.tree_sum(x)
    assert torch.equal(reference.tree_sum(x[5:6]), full[5:6])
    assert torch.equal(reference.tree_sum(x.flip(0)), full.flip(0))
    torch.testing.assert_close(full, x.double().sum(-1).float(), rtol=1e-5, atol=1e-4)


def test_reference_ops_pass_the_device_kernel_checks():
    """The checks the GPU script runs first (accuracy vs torch, row invariance, decode vs
    prefill attention), here with the pure-torch reference."""
    records = run_kernel_checks("cpu")
    assert [r["name"] for r in records if not r["ok"]] == []
    assert len(records) == 7


def test_functional_moe_matches_tidal_qwen3_on_the_same_weights():
    """The benchmark's model is tidal's architecture: same weights, same logits (fp32)."""
    from tidal.model.config import ModelConfig
    from tidal.model.qwen3 import build_model

    shape = SIZES["tiny"]
    fields = {k: v for k, v in shape.as_dict().items() if k in ModelConfig.model_fields}
    ref = build_model(ModelConfig(**fields, tie_word_embeddings=False), seed=3).eval()
    model = MoEModel.from_tidal_state_dict(shape, ref.state_dict())
    ids = torch.randint(0, shape.vocab_size, (2, 9))
    with torch.no_grad():
        want, want_experts = ref(ids, return_experts=True)
    slot, pos = torch.arange(2).repeat_interleave(9), torch.arange(9).repeat(2)
    for ops in (FastOps(), DeterministicOps(use_triton=False)):
        hidden, experts = model.forward(ops, ids.reshape(-1), slot, pos, model.new_cache(2, 9), 9,
                                        seg_lens=[9, 9])
        got = model.logprobs(ops, hidden).view(2, 9, -1)
        torch.testing.assert_close(got, torch.log_softmax(want, -1), rtol=1e-4, atol=1e-4)
        assert torch.equal(experts.view(2, 9, *experts.shape[1:]).sort(-1).values,
                           want_experts.sort(-1).values)


def test_tiny_cpu_run_is_bitwise_equal_in_deterministic_mode(tmp_path):
    path = tmp_path / "numerics.json"
    result = run_numerics("tiny", "cpu", json_path=str(path))
    assert path.exists() and result["errors"] == {}
    det, fast = result["deterministic"], result["fast"]
    assert det["generated_tokens"] == fast["generated_tokens"] > 100
    for key in ("no_replay", "replay"):
        assert det[key]["bitwise_equal_fraction"] == 1.0
        assert det[key]["kl_k3"] == 0.0 and det[key]["max_abs_logprob_diff"] == 0.0
        assert det[key]["flip_rate"] == 0.0
    assert fast["replay"]["flip_rate"] == 0.0  # replay: the trainer uses the engine's experts
    assert fast["no_replay"]["bitwise_equal_fraction"] < 1.0  # the gap deterministic mode closes
    assert result["throughput_ratio"] > 0


def test_replay_keeps_the_engines_experts_when_the_trainers_router_differs():
    """Perturb the trainer's router so its own top-k flips; replay still trains the engine's."""
    shape = SIZES["tiny"]
    model = MoEModel.random(shape, "cpu", torch.float32, seed=1)
    ops = DeterministicOps(use_triton=False)
    (prompts, gen_lens), = make_prompts(Workload((4,), (3, 6), (4, 8)), shape.vocab_size, 0)
    wave, _, _ = generate_wave(model, ops, prompts, gen_lens, torch.Generator().manual_seed(0), NO_SYNC)
    for layer in model.layers:
        layer.router += 0.05 * torch.randn_like(layer.router)
    _, _, engine_ex, own = trainer_pass(model, ops, wave, replay=False)
    _, _, _, replayed = trainer_pass(model, ops, wave, replay=True)
    assert not torch.equal(own.sort(-1).values, engine_ex.sort(-1).values)
    assert torch.equal(replayed, engine_ex)


def _interpreted_triton_ops():
    """DeterministicOps on the Triton kernels, run by Triton's interpreter on CPU tensors."""
    if torch.cuda.is_available():
        return DeterministicOps(use_triton=True)
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated (first import)
    _patch_interpreter_for_numpy2_and_bf16()
    return DeterministicOps(use_triton=True)


def _patch_interpreter_for_numpy2_and_bf16():
    """Three gaps of Triton 3.6's interpreter (not of the compiled kernels):
    - a scalar loop bound is a 1-element array that numpy >= 2.3 refuses to turn into an int;
    - tl.dot on bf16 multiplies the raw 16-bit patterns (numpy has no bf16);
    - tl.dot is numpy's BLAS matmul of the tile, whose result for a row depends on where the
      row sits in the tile (micro-kernel edges). A GPU's MMA computes every row alike; here the
      tile's dot runs in float64 (bf16 products exact, a 64-term sum rounded once to fp32),
      which is row-position independent too. So these tests check the kernels' indexing,
      masks, K order and tiling, given a dot that treats each row alike."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter, "_tidal_patched", False):
        return
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
    interpreter._tidal_patched = True


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_pass_the_checks_in_the_interpreter():
    records = run_kernel_checks("cpu", _interpreted_triton_ops(), small=True)
    assert [r for r in records if not r["ok"]] == []


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_make_engine_and_trainer_bitwise_equal():
    """The whole engine/trainer path on the Triton kernels (interpreted): bf16, GQA, MoE."""
    shape = SIZES["tiny"]
    model = MoEModel.random(shape, "cpu", torch.bfloat16, seed=2)
    spec = make_prompts(Workload((3, 1), (3, 7), (3, 7)), shape.vocab_size, 0)
    result = {}
    run_mode(model, _interpreted_triton_ops(), spec, 0, NO_SYNC, result)
    for key in ("no_replay", "replay"):
        assert result["deterministic"][key]["bitwise_equal_fraction"] == 1.0
        assert result["deterministic"][key]["flip_rate"] == 0.0
